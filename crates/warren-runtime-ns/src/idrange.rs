//! Host id ranges of sandboxes: each sandbox maps its ids 0..65536 onto a range of its own.
//!
//! With one shared range, any host process running as one of its ids (a sandbox that escaped
//! its mount namespace, a local user's rootless container whose `/etc/subuid` range is the
//! same) could read and write every sandbox's files and signal or trace its processes.
//!
//! Ranges are `first + k * 65536`. An assignment is a file `<dir>/<holder>` holding the range's
//! first id, written durably before the range is used, so a restarted server knows every range
//! in use. A range is free when no holder has it, it is not listed by the caller as in use
//! (saved layers on disk still owned by it), and it overlaps no entry of `/etc/subuid` or
//! `/etc/subgid`.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::config::ID_COUNT;

/// Files listing the ranges delegated to host users.
pub const SUBID_FILES: &[&str] = &["/etc/subuid", "/etc/subgid"];

/// The persistent set of assigned ranges.
#[derive(Debug)]
pub struct IdRanges {
    dir: PathBuf,
    first: u32,
    lock: Mutex<()>,
}

/// `(start, count)` of every entry in the sub-id files (missing files list nothing).
pub fn delegated_ranges() -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for file in SUBID_FILES {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines() {
            let mut parts = line.trim().split(':');
            let (_, Some(start), Some(count)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            if let (Ok(s), Ok(c)) = (start.trim().parse::<u64>(), count.trim().parse::<u64>()) {
                out.push((s, c));
            }
        }
    }
    out
}

/// The sub-id entry `base..base+65536` overlaps, if any, as `start:count`.
pub fn overlap(base: u32) -> Option<String> {
    let (lo, hi) = (u64::from(base), u64::from(base) + u64::from(ID_COUNT));
    delegated_ranges()
        .into_iter()
        .find(|(s, c)| *s < hi && lo < s + c)
        .map(|(s, c)| format!("{s}:{c}"))
}

fn valid_holder(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 200
        && !h.starts_with('.')
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

impl IdRanges {
    /// Opens (creating) the assignment directory; ranges start at host id `first`.
    pub fn open(dir: &Path, first: u32) -> io::Result<IdRanges> {
        fs::create_dir_all(dir)?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        Ok(IdRanges {
            dir: dir.to_path_buf(),
            first,
            lock: Mutex::new(()),
        })
    }

    /// Every holder and its range.
    pub fn holders(&self) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return out;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !valid_holder(&name) {
                continue;
            }
            if let Some(base) = fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                out.insert(name, base);
            }
        }
        out
    }

    /// The range of `holder`, if it has one.
    pub fn get(&self, holder: &str) -> Option<u32> {
        if !valid_holder(holder) {
            return None;
        }
        fs::read_to_string(self.dir.join(holder))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// The range of `holder`: its existing one, or a free one assigned now (durably).
    /// `in_use` lists further ranges to avoid (those of saved layers).
    pub fn assign(&self, holder: &str, in_use: &[u32]) -> io::Result<u32> {
        if !valid_holder(holder) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid id range holder {holder:?}"),
            ));
        }
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(base) = self.get(holder) {
            return Ok(base);
        }
        let mut used: HashSet<u32> = self.holders().into_values().collect();
        used.extend(in_use.iter().copied());
        let delegated = delegated_ranges();
        let mut base = u64::from(self.first);
        let step = u64::from(ID_COUNT);
        // Leave the last ids (65535 and 4294967295 are "no id" values) alone.
        while base + step < u64::from(u32::MAX) {
            let b = base as u32;
            let clash = delegated
                .iter()
                .any(|(s, c)| *s < base + step && base < s + c);
            if !used.contains(&b) && !clash {
                self.write(holder, b)?;
                return Ok(b);
            }
            base += step;
        }
        Err(io::Error::new(
            io::ErrorKind::StorageFull,
            "no free host id range is left",
        ))
    }

    fn write(&self, holder: &str, base: u32) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{holder}.tmp"));
        let mut f = fs::File::create(&tmp)?;
        f.write_all(format!("{base}\n").as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join(holder))?;
        fs::File::open(&self.dir)?.sync_all()
    }

    /// Frees the range of `holder`. Idempotent.
    pub fn release(&self, holder: &str) -> io::Result<()> {
        if !valid_holder(holder) {
            return Ok(());
        }
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        match fs::remove_file(self.dir.join(holder)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => fs::File::open(&self.dir)?.sync_all(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_disjoint_persistent_and_avoid_delegated_ids() {
        let dir = std::env::temp_dir().join(format!("warren-idrange-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        // Start inside the default /etc/subuid allocation when one exists, to see it skipped.
        let delegated = delegated_ranges();
        let first = delegated.first().map_or(1 << 30, |(s, _)| *s as u32);
        let ids = IdRanges::open(&dir, first).unwrap();
        let a = ids.assign("sandbox-a", &[]).unwrap();
        let b = ids.assign("sandbox-b", &[a + ID_COUNT]).unwrap();
        assert_ne!(a, b);
        assert!(a.abs_diff(b) >= ID_COUNT);
        assert_ne!(b, a + ID_COUNT, "a range listed as in use was assigned");
        for base in [a, b] {
            assert_eq!(overlap(base), None, "{base} overlaps a delegated range");
        }
        assert_eq!(
            ids.assign("sandbox-a", &[]).unwrap(),
            a,
            "assignments are stable"
        );
        let reopened = IdRanges::open(&dir, first).unwrap();
        assert_eq!(reopened.get("sandbox-b"), Some(b), "assignments persist");
        reopened.release("sandbox-a").unwrap();
        assert_eq!(reopened.get("sandbox-a"), None);
        let _ = fs::remove_dir_all(&dir);
    }
}

//! The host uids and gids VM QEMUs run as: `vm_uid_base + slot index`, one per network slot,
//! so no two running VMs share one.
//!
//! A uid is reused by the next VM of its slot. That leaks nothing: a jailed QEMU leaves
//! nothing on the host that belongs to its uid (its files are root's through the jail's
//! id-mapped mounts, its log tmpfs is unmounted with its directory, its processes die with its
//! cgroup). What must not happen is that **someone else** holds the same ids: a user whose
//! `/etc/subuid` or `/etc/subgid` range covers them (a rootless container would then run as a
//! QEMU's uid), or an account of the host. The runtime refuses to start then.

use std::path::Path;

/// The `name:start:count` ranges of a subordinate id file that overlap `[base, base + n)`.
pub fn overlapping_subids(text: &str, base: u32, n: u32) -> Vec<String> {
    let end = u64::from(base) + u64::from(n);
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|l| {
            let mut f = l.split(':').skip(1);
            let start = f.next().and_then(|s| s.trim().parse::<u64>().ok());
            let count = f.next().and_then(|s| s.trim().parse::<u64>().ok());
            match (start, count) {
                (Some(s), Some(c)) => s < end && u64::from(base) < s + c,
                // An entry we cannot read might be anything.
                _ => true,
            }
        })
        .map(str::to_string)
        .collect()
}

/// Accounts of a passwd or group file whose id (third field) is in `[base, base + n)`.
pub fn accounts_in_range(text: &str, base: u32, n: u32) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let id = l.split(':').nth(2)?.parse::<u32>().ok()?;
            (base..base.saturating_add(n))
                .contains(&id)
                .then(|| l.split(':').next().unwrap_or_default().to_string())
        })
        .collect()
}

/// Refuses ids `[base, base + n)` when the host hands any of them to someone else.
pub fn check_free(base: u32, n: u32) -> Result<(), String> {
    check_free_in(Path::new("/etc"), base, n)
}

pub fn check_free_in(etc: &Path, base: u32, n: u32) -> Result<(), String> {
    let read = |f: &str| std::fs::read_to_string(etc.join(f)).unwrap_or_default();
    let mut problems = Vec::new();
    for f in ["subuid", "subgid"] {
        for entry in overlapping_subids(&read(f), base, n) {
            problems.push(format!("{}/{f} has {entry:?}", etc.display()));
        }
    }
    for f in ["passwd", "group"] {
        for name in accounts_in_range(&read(f), base, n) {
            problems.push(format!("{}/{f} has {name:?}", etc.display()));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the vm runtime runs QEMUs as uids/gids {base}..{}, which the host also hands out ({}); \
         move those ranges or choose another VM uid base",
        u64::from(base) + u64::from(n) - 1,
        problems.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subid_ranges_that_cover_vm_uids_are_found() {
        let text = "user:100000:65536\nother:165536:65536\n# comment\nthird:300000:10\n";
        assert_eq!(
            overlapping_subids(text, 200_000, 64),
            vec!["other:165536:65536"]
        );
        assert!(overlapping_subids("user:100000:65536\n", 200_000, 64).is_empty());
        // Touching the end of a range is no overlap; one id inside is.
        assert!(overlapping_subids("a:199936:64\n", 200_000, 64).is_empty());
        assert_eq!(overlapping_subids("a:200063:1\n", 200_000, 64).len(), 1);
        assert_eq!(overlapping_subids("garbled\n", 200_000, 64).len(), 1);
    }

    #[test]
    fn a_host_with_overlapping_ranges_is_refused_with_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("warren-uids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        struct Gone<'a>(&'a Path);
        impl Drop for Gone<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(self.0);
            }
        }
        let _gone = Gone(&dir);
        let etc = &dir;
        std::fs::write(etc.join("subuid"), "user:100000:65536\nu2:165536:65536\n").unwrap();
        std::fs::write(etc.join("subgid"), "user:100000:65536\n").unwrap();
        std::fs::write(etc.join("passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        let err = check_free_in(etc, 200_000, 4).unwrap_err();
        assert!(err.contains("subuid has \"u2:165536:65536\""), "{err}");
        assert!(check_free_in(etc, 300_000, 4).is_ok());
        std::fs::write(etc.join("passwd"), "svc:x:300002:300002::/:/bin/false\n").unwrap();
        let err = check_free_in(etc, 300_000, 4).unwrap_err();
        assert!(err.contains("passwd has \"svc\""), "{err}");
    }
}

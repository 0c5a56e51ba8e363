//! The data disk's reserve: uploads and builds stop before they eat into the space kept free
//! for the server's store, pauses and snapshots, and say so with the numbers.

use std::path::PathBuf;

/// The disk holding `dir`, of which `bytes` stay free.
#[derive(Debug, Clone)]
pub(crate) struct Reserve {
    dir: PathBuf,
    bytes: u64,
}

impl Reserve {
    pub(crate) fn new(dir: PathBuf, bytes: u64) -> Reserve {
        Reserve { dir, bytes }
    }

    /// `Err(why)` when writing `needed` more bytes would leave less than the reserve free. A
    /// disk that cannot be asked (statvfs failing) is not held against the caller: the write
    /// itself will say if the disk is full.
    pub(crate) fn check(&self, what: &str, needed: u64) -> Result<(), String> {
        let Ok(st) = rustix::fs::statvfs(&self.dir) else {
            return Ok(());
        };
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        if free >= needed.saturating_add(self.bytes) {
            return Ok(());
        }
        Err(format!(
            "the host's disk has no room for {what}: it needs {needed} bytes, {free} are free \
             and {} of those stay free for the server; free space (prune templates, delete \
             snapshots or volumes) and try again",
            self.bytes
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_larger_than_the_disk_refuses_with_the_numbers() {
        let dir = std::env::temp_dir();
        assert_eq!(Reserve::new(dir.clone(), 0).check("x", 0), Ok(()));
        let e = Reserve::new(dir, u64::MAX / 2)
            .check("an upload", 10)
            .unwrap_err();
        assert!(e.contains("an upload") && e.contains("10 bytes"), "{e}");
        assert!(e.contains(&(u64::MAX / 2).to_string()), "{e}");
    }
}

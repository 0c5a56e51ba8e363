//! Removing what an upload interrupted by a crash left in a volume.

use cap_fs_ext::DirExt;
use std::time::SystemTime;

use cap_std::fs::Dir;

use crate::content::{Content, TEMP_PREFIX};
use crate::VolumeError;

impl Content {
    /// Removes every file named like an upload's temporary name ([`TEMP_PREFIX`]) anywhere in
    /// the volume and last written before `started` (the server's start: uploads of this run
    /// are newer), never following a symbolic link; returns how many.
    pub fn remove_leftover_uploads(&self, started: SystemTime) -> Result<usize, VolumeError> {
        let io = |e: std::io::Error| VolumeError::io("sweeping leftover uploads".to_string(), e);
        let mut removed = 0;
        let mut dirs: Vec<Dir> = vec![self.root.try_clone().map_err(io)?];
        while let Some(dir) = dirs.pop() {
            for entry in dir.entries().map_err(io)? {
                let entry = entry.map_err(io)?;
                let name = entry.file_name();
                let ty = entry.file_type().map_err(io)?;
                if ty.is_dir() {
                    // Opened without following a link swapped in meanwhile.
                    if let Ok(sub) = dir.open_dir_nofollow(&name) {
                        dirs.push(sub);
                    }
                } else if ty.is_file() && name.to_string_lossy().starts_with(TEMP_PREFIX) {
                    let old = entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t.into_std() < started);
                    if old {
                        dir.remove_file(&name).map_err(io)?;
                        removed += 1;
                    }
                }
            }
        }
        Ok(removed)
    }
}

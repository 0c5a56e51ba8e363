//! The agent binary as sandboxes see it: a copy on a small read-only tmpfs of its own.
//!
//! A bind mount's entry in `/proc/self/mountinfo` names the source's path inside its
//! filesystem. Bound straight from the host it would show where Warren is installed (or built);
//! bound from this tmpfs it shows `/warren-agent`. The copy is made once per agent build (its
//! size and modification time are compared) and shared by every sandbox.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::launch::NsConfig;

const NAME: &str = "warren-agent";

/// Serialises staging within this process (launches run concurrently).
static LOCK: Mutex<()> = Mutex::new(());

/// The directory of the staged copy: next to the state directory (not inside it, where every
/// entry is taken for a sandbox).
fn dir(cfg: &NsConfig) -> PathBuf {
    let mut name = cfg.state_dir.as_os_str().to_os_string();
    name.push(".agent");
    PathBuf::from(name)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => {
            a.len() == b.len() && a.mtime() == b.mtime() && a.mtime_nsec() == b.mtime_nsec()
        }
        _ => false,
    }
}

/// The staged agent for `cfg`, copied there first if it is missing or outdated. Blocking (a
/// lock, a copy): async callers run it on the blocking pool.
pub fn agent(cfg: &NsConfig) -> io::Result<PathBuf> {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = dir(cfg);
    let staged = dir.join(NAME);
    if same_file(&cfg.agent_bin, &staged) {
        return Ok(staged);
    }
    fs::create_dir_all(&dir)?;
    // A fresh tmpfs each time: sandboxes still running keep the old one through their binds.
    let _ = umount2(&dir, MntFlags::MNT_DETACH);
    let size = fs::metadata(&cfg.agent_bin)?.len() + (1 << 20);
    mount(
        Some("warren-agent"),
        &dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={size},mode=0755").as_str()),
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("mount a tmpfs on {}: {e}", dir.display()),
        )
    })?;
    let out = std::process::Command::new("cp")
        .arg("--preserve=mode,timestamps")
        .arg(&cfg.agent_bin)
        .arg(&staged)
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "copy {} to {}: {}",
            cfg.agent_bin.display(),
            staged.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    mount(
        None::<&str>,
        &dir,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={size},mode=0755").as_str()),
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("remount {} read-only: {e}", dir.display()),
        )
    })?;
    Ok(staged)
}

/// Unmounts and removes the staged copy (when the runtime is decommissioned). Idempotent.
pub fn remove(cfg: &NsConfig) -> io::Result<()> {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = dir(cfg);
    let _ = umount2(&dir, MntFlags::MNT_DETACH);
    match fs::remove_dir(&dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

//! Flattening a VM's disk overlay into a checkpoint's self-contained `disk.qcow2`.
//!
//! The overlay is written by the guest's QEMU, so its header (backing file name and format, an
//! external data file, a `json:` pseudo-protocol) is whatever a compromised QEMU wrote there.
//! Root must not follow it: `qemu-img convert` would copy any host file into the checkpoint or
//! fetch URLs from the host's network. So:
//!
//! - the header is checked first: the backing file must be the one the manager linked, and an
//!   external data file is refused (the operation then fails, and the VM runs on);
//! - the chain is pinned: `qemu-img` gets a `json:` description naming the overlay, its one
//!   backing file and that file's format (a qcow2 base with no backing of its own), never the
//!   names in the header;
//! - it runs jailed as the VM's own user ([`crate::jail`]), in the VM's network namespace,
//!   seeing only the overlay, the backing file and the output.

use std::path::Path;

use serde_json::json;

use crate::checkpoint::CaptureSpec;
use crate::error::{Error, Result};

/// qcow2 incompatible feature bits that make QEMU open other files: an external data file.
const EXTERNAL_DATA_FILE: u64 = 1 << 2;
/// The image is marked corrupt.
const CORRUPT: u64 = 1 << 1;

/// Checks the header of the qcow2 `overlay`: its backing file must be `backing`, and it must
/// have no external data file.
pub fn check_header(overlay: &Path, backing: &Path) -> Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let bad =
        |why: String| Error::Invalid(format!("refusing to flatten {}: {why}", overlay.display()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(overlay)
        .map_err(Error::io("open", overlay))?;
    if !f.metadata().map(|m| m.is_file()).unwrap_or(false) {
        return Err(bad("not a regular file".into()));
    }
    let mut head = [0u8; 104];
    f.read_exact_at(&mut head, 0)
        .map_err(Error::io("read the header of", overlay))?;
    let be64 = |at: usize| u64::from_be_bytes(head[at..at + 8].try_into().unwrap_or_default());
    let be32 = |at: usize| u32::from_be_bytes(head[at..at + 4].try_into().unwrap_or_default());
    if head[..4] != *b"QFI\xfb" {
        return Err(bad("not a qcow2 image".into()));
    }
    let version = be32(4);
    if !(2..=3).contains(&version) {
        return Err(bad(format!("qcow2 version {version}")));
    }
    if version == 3 && be64(72) & (EXTERNAL_DATA_FILE | CORRUPT) != 0 {
        return Err(bad(
            "it has an external data file or is marked corrupt".into()
        ));
    }
    let (offset, len) = (be64(8), be32(16) as usize);
    if offset == 0 || len == 0 || len > 1023 {
        return Err(bad("its backing file is not the expected one".into()));
    }
    let mut name = vec![0u8; len];
    f.read_exact_at(&mut name, offset)
        .map_err(Error::io("read the header of", overlay))?;
    if name != backing.as_os_str().as_encoded_bytes() {
        return Err(bad(format!(
            "its backing file was changed to {:?}",
            crate::qemu::escape(&String::from_utf8_lossy(&name))
        )));
    }
    Ok(())
}

/// The `json:` image description of `overlay` on exactly `backing` (`raw`, or a qcow2 that
/// has no backing file of its own).
pub fn pinned_chain(overlay: &Path, backing: &Path, backing_format: &str) -> String {
    let file = |p: &Path| json!({ "driver": "file", "filename": p.to_string_lossy() });
    let mut base = json!({ "driver": backing_format, "file": file(backing) });
    if backing_format == "qcow2" {
        base["backing"] = serde_json::Value::Null;
    }
    let top = json!({ "driver": "qcow2", "file": file(overlay), "backing": base });
    format!("json:{top}")
}

/// Flattens the VM's overlay (`spec.disk` on `spec.backing`) into `out`.
pub async fn flatten(spec: &CaptureSpec, out: &Path) -> Result<()> {
    check_header(&spec.disk, &spec.backing)?;
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(out);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(out)
            .map_err(Error::io("create", out))?;
    }
    let qemu_img = std::fs::canonicalize(crate::qemu::resolve(Path::new("qemu-img"))?)
        .map_err(Error::io("resolve", "qemu-img"))?;
    let source = pinned_chain(&spec.disk, &spec.backing, spec.backing_format);
    let mut cmd = tokio::process::Command::new(&qemu_img);
    // -U: QEMU still holds the image (stopped, its caches flushed).
    cmd.args(["convert", "-U", "-q", "-O", "qcow2"])
        .arg(&source)
        .arg(out)
        .env_clear()
        .stdin(std::process::Stdio::null());
    let mut keep = Vec::new();
    if let Some((uid, gid)) = spec.run_as {
        let root = spec.work.join("flatten-root");
        let _ = std::fs::remove_dir_all(&spec.work);
        crate::snapshot::private_dir(&root)?;
        let jail = crate::jail::Jail {
            uid,
            gid,
            groups: Vec::new(),
            root,
            read: vec![spec.disk.clone(), spec.backing.clone()],
            write: vec![out.to_path_buf()],
            devices: Vec::new(),
            limits: crate::jail::Limits {
                nofile: 256,
                nproc: 256,
                fsize: crate::snapshot::virtual_size(&spec.disk) + (256 << 20),
            },
        }
        .prepare(&qemu_img)?;
        let netns = match &spec.netns {
            Some(p) => Some(std::fs::File::open(p).map_err(Error::io("open", p))?),
            None => None,
        };
        let ns_fd = netns.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        keep.push(netns);
        // SAFETY: the closure runs in the child between fork and exec and makes only
        // async-signal-safe calls (setns, and the jail's: see `Prepared::enter`) on a
        // descriptor and buffers that stay valid until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = ns_fd {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                jail.enter()
            });
        }
    }
    let result = match spec.run_as {
        Some(_) => {
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            match crate::jail::spawn_in_own_pid_ns(&mut cmd) {
                Ok(child) => child.wait_with_output().await,
                Err(e) => Err(e),
            }
        }
        None => cmd.output().await,
    };
    drop(keep);
    let _ = std::fs::remove_dir_all(spec.work.join("flatten-root"));
    let output = result.map_err(Error::io("run qemu-img convert for", out))?;
    if !output.status.success() {
        return Err(Error::Command {
            command: format!("qemu-img convert {}", spec.disk.display()),
            stderr: crate::qemu::escape(String::from_utf8_lossy(&output.stderr).trim()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(dir: &Path, backing: &Path) -> std::path::PathBuf {
        std::fs::write(backing, vec![0u8; 1 << 20]).unwrap();
        let top = dir.join("top.qcow2");
        let ok = std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(backing)
            .arg(&top)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            panic!("qemu-img is needed for this test (scripts/setup.sh installs it)");
        }
        top
    }

    #[test]
    fn header_with_the_linked_backing_passes_and_a_rewritten_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.raw");
        let top = overlay(dir.path(), &base);
        check_header(&top, &base).expect("the manager's own overlay passes");
        let other = dir.path().join("secret");
        std::fs::write(&other, b"secret").unwrap();
        let ok = std::process::Command::new("qemu-img")
            .args(["rebase", "-u", "-q", "-F", "raw", "-b"])
            .arg(&other)
            .arg(&top)
            .status()
            .unwrap();
        assert!(ok.success());
        let err = check_header(&top, &base).unwrap_err().to_string();
        assert!(err.contains("backing file was changed"), "{err}");
    }

    #[test]
    fn the_pinned_chain_names_only_the_given_files() {
        let s = pinned_chain(Path::new("/d/top"), Path::new("/d/base"), "qcow2");
        let v: serde_json::Value = serde_json::from_str(s.strip_prefix("json:").unwrap()).unwrap();
        assert_eq!(v["file"]["filename"], "/d/top");
        assert_eq!(v["backing"]["file"]["filename"], "/d/base");
        assert!(v["backing"]["backing"].is_null());
    }
}

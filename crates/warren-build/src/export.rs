//! Exporting a build sandbox's root filesystem through its agent, for runtimes that cannot
//! read it from the host (the vm runtime: the guest's writable layer lives on its own disk).
//!
//! The guest streams `tar` of its root (one filesystem: no /proc, /sys, /dev or /run; not the
//! agent) over the agent's process output. The host unpacks it with the `tar` crate into a
//! staging tree, in user space: a guest-made filesystem is never mounted on the host, and
//! every entry's path is checked to stay inside the staging tree (`unpack_in`); devices and
//! fifos are skipped. Owners, modes (setuid included: `sudo` needs it) and extended
//! attributes (file capabilities) are kept. The tree is then packed into an erofs image.

use std::io::Read;
use std::path::Path;

use crate::sandbox::{BuildBox, Stream};

/// Reads the chunks a channel delivers as one byte stream.
struct ChannelReader {
    rx: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    chunk: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(c) => {
                    self.chunk = c;
                    self.pos = 0;
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// What `unpack` did: entries written and entries left out (devices, fifos).
struct Unpacked {
    written: u64,
    skipped: u64,
}

fn unpack(reader: impl Read, dest: &Path) -> Result<Unpacked, String> {
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(true);
    archive.set_overwrite(true);
    let (mut written, mut skipped) = (0u64, 0u64);
    let entries = archive
        .entries()
        .map_err(|e| format!("reading the guest's archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("reading the guest's archive: {e}"))?;
        match entry.header().entry_type() {
            tar::EntryType::Regular
            | tar::EntryType::Continuous
            | tar::EntryType::GNUSparse
            | tar::EntryType::Directory
            | tar::EntryType::Symlink
            | tar::EntryType::Link => {
                entry
                    .unpack_in(dest)
                    .map_err(|e| format!("unpacking the guest's files: {e}"))?;
                written += 1;
            }
            _ => skipped += 1,
        }
    }
    Ok(Unpacked { written, skipped })
}

/// The guest's archiver. GNU tar stays on the root filesystem by itself and leaves the agent
/// out; another tar (busybox's has neither option) archives the top-level entries but the
/// kernel's and the runtime's mounts, and the host drops the agent after unpacking. An image
/// without any tar gets the host's static busybox for the export.
const EXPORT_SCRIPT: &str = r#"
if tar --version 2>/dev/null | grep -q 'GNU tar'; then
  exec tar --one-file-system --numeric-owner --xattrs --xattrs-include='*' -C / -cf - \
    --exclude=./usr/local/bin/warren-agent --exclude='./tmp/.warren-copy-*' .
fi
if command -v tar >/dev/null 2>&1; then T=tar; else T="/tmp/.warren-busybox tar"; fi
cd / || exit 2
set --
for e in $(ls -A /); do
  case "$e" in proc|sys|dev|run|.warren-busybox) ;; *) set -- "$@" "./$e" ;; esac
done
exec $T --numeric-owner -cf - "$@"
"#;

/// Where the host's static busybox is, for images without a tar.
const HOST_BUSYBOX: &str = "/bin/busybox";

/// Makes the unpacked tree what an image holds: not the agent (the runtime adds its own) nor
/// the build's scratch files, and the mount points the runtimes use. The tree came from the
/// guest, so its symlinks are resolved inside it ([`warren_oci::ImageTree`]): a guest that made
/// `usr/local/bin` or `tmp` a link to a host path cannot make the host remove files there.
fn tidy(tree: &Path) -> std::io::Result<()> {
    let tree = warren_oci::ImageTree::open(tree)?;
    for f in ["usr/local/bin/warren-agent", "tmp/.warren-busybox"] {
        tree.remove(Path::new(f))?;
    }
    for name in tree.names(Path::new("tmp"))? {
        if name.to_string_lossy().starts_with(".warren-copy-") {
            let _ = tree.remove(&Path::new("tmp").join(name));
        }
    }
    for d in ["dev", "proc", "sys", "run"] {
        tree.real_dir(Path::new(d), None)?;
    }
    Ok(())
}

/// Writes `b`'s root filesystem as the erofs image `out`.
pub(crate) async fn through_agent(b: &BuildBox, out: &Path) -> Result<(), String> {
    let staging = out.with_extension("tree");
    tokio::fs::create_dir_all(&staging)
        .await
        .map_err(|e| format!("create {}: {e}", staging.display()))?;
    let result = async {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let st = staging.clone();
        let unpacking = tokio::task::spawn_blocking(move || {
            unpack(
                ChannelReader {
                    rx,
                    chunk: Vec::new(),
                    pos: 0,
                },
                &st,
            )
        });
        let has_tar = b
            .root_script("command -v tar >/dev/null 2>&1 && echo yes || echo no")
            .await?;
        if has_tar.trim() != "yes" {
            if !Path::new(HOST_BUSYBOX).is_file() {
                return Err(format!(
                    "the image has no tar to export the build with, and this host has no \
                     {HOST_BUSYBOX} to lend it (install busybox-static)"
                ));
            }
            b.upload(Path::new(HOST_BUSYBOX), "/tmp/.warren-busybox")
                .await?;
            b.root_script("chmod 0755 /tmp/.warren-busybox").await?;
        }
        let argv = [
            "/bin/sh".to_string(),
            "-c".to_string(),
            EXPORT_SCRIPT.to_string(),
        ];
        let mut stderr = Vec::new();
        let code = b
            .run_raw(
                &argv,
                "root",
                Some("/"),
                &Default::default(),
                |s, bytes| match s {
                    Stream::Stdout => {
                        let _ = tx.send(bytes.to_vec());
                    }
                    Stream::Stderr => {
                        if stderr.len() < 8192 {
                            stderr.extend_from_slice(bytes);
                        }
                    }
                },
            )
            .await;
        drop(tx);
        let unpacked = unpacking.await.map_err(|e| format!("unpack task: {e}"))?;
        let code = code?;
        // GNU tar's 1 is "a file changed as we read it": the build sandbox is idle, and what
        // it read is consistent per file.
        if code != 0 && code != 1 {
            return Err(format!(
                "tar in the build sandbox failed (exit status {code}): {}",
                String::from_utf8_lossy(&stderr).trim()
            ));
        }
        let unpacked = unpacked?;
        if unpacked.written == 0 {
            return Err(format!(
                "the build sandbox's tar wrote nothing (exit status {code}): {}",
                String::from_utf8_lossy(&stderr).trim()
            ));
        }
        if unpacked.skipped > 0 {
            tracing::debug!(
                skipped = unpacked.skipped,
                "device files and fifos left out of the image"
            );
        }
        let st = staging.clone();
        tokio::task::spawn_blocking(move || tidy(&st))
            .await
            .map_err(|e| format!("tidy task: {e}"))?
            .map_err(|e| format!("tidying the exported tree: {e}"))?;
        let (st, o) = (staging.clone(), out.to_path_buf());
        tokio::task::spawn_blocking(move || {
            warren_template::pack_layers(&[&st], &o).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("pack task: {e}"))?
    }
    .await;
    let st = staging.clone();
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(st)).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest tree whose `usr/local/bin` and `tmp` link to host directories: the host files
    /// named like the agent and the build's scratch files stay.
    #[test]
    fn tidy_removes_nothing_through_the_guests_links() {
        use std::os::unix::fs::symlink;
        let host = tempfile::tempdir().unwrap();
        for f in ["warren-agent", ".warren-busybox", ".warren-copy-1"] {
            std::fs::write(host.path().join(f), "host's").unwrap();
        }
        let guest = tempfile::tempdir().unwrap();
        let tree = guest.path();
        std::fs::create_dir_all(tree.join("usr/local")).unwrap();
        symlink(host.path(), tree.join("usr/local/bin")).unwrap();
        symlink(host.path(), tree.join("tmp")).unwrap();
        symlink(host.path(), tree.join("dev")).unwrap();

        tidy(tree).unwrap();

        for f in ["warren-agent", ".warren-busybox", ".warren-copy-1"] {
            assert!(host.path().join(f).is_file(), "{f} is still on the host");
        }
        assert!(tree.join("dev").symlink_metadata().unwrap().is_dir());
        for d in ["proc", "sys", "run"] {
            assert!(tree.join(d).is_dir(), "{d}");
        }
    }
}

//! Packing a stack of directory layers (a sandbox's writable upper over its template's
//! mounted image) into one erofs image: what a template build keeps.
//!
//! The layers are merged by a read-only overlayfs mount, made in a private mount namespace of
//! a child process (`unshare --mount`), so the mount can never outlive the pack or show up in
//! the host's mount table, and whiteouts and opaque directories of the upper layer mean what
//! they meant in the sandbox. `mkfs.erofs` then reads the merged tree.

use std::path::Path;
use std::process::Command;

use crate::command::{self, MKFS_EROFS, UNSHARE};
use crate::error::{ImageError, Result};

/// Packs `layers` (top first, as overlayfs's `lowerdir` lists them) into the erofs image
/// `out` (lz4: built images are made often, and lz4 packs three times faster than lz4hc for
/// the same read speed). Needs root.
pub fn pack_layers(layers: &[&Path], out: &Path) -> Result<()> {
    if layers.is_empty() {
        return Err(ImageError::Pack("no layers to pack".into()));
    }
    for l in layers {
        let s = l.to_string_lossy();
        // overlayfs separates layers with ':' and options with ','.
        if s.contains([':', ',']) || !l.is_absolute() {
            return Err(ImageError::Pack(format!(
                "layer path {s:?} must be absolute without ':' or ','"
            )));
        }
    }
    let mkfs = command::locate(MKFS_EROFS)?;
    let unshare = command::locate(UNSHARE)?;
    let lower = layers
        .iter()
        .map(|l| l.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(":");
    let mnt = out.with_extension("merged");
    std::fs::create_dir_all(&mnt).map_err(ImageError::io("create", &mnt))?;
    // One layer is a plain directory; overlayfs wants at least two lower layers when it has
    // no upper, so a single layer is packed as it is.
    let script = if layers.len() == 1 {
        r#"exec "$1" --quiet -zlz4 "$2" "$4""#
    } else {
        r#"mount -t overlay overlay -o "ro,lowerdir=$3" "$4" && exec "$1" --quiet -zlz4 "$2" "$4""#
    };
    let src = if layers.len() == 1 {
        layers[0].to_path_buf()
    } else {
        mnt.clone()
    };
    let mut cmd = Command::new(unshare);
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        script,
        "pack",
    ])
    .arg(&mkfs)
    .arg(out)
    .arg(&lower)
    .arg(&src);
    let result = command::capture(&mut cmd).map(|_| ());
    let _ = std::fs::remove_dir(&mnt);
    result?;
    crate::verify_image(out)?;
    Ok(())
}

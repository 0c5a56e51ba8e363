//! What an unpacked layer keeps: PAX records (long names, uid/gid, xattrs), fifos (device
//! nodes are left out), and a lower entry of one kind replaced by one of another kind. Local
//! layer files, no registry.

mod common;

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};

use common::*;
use warren_oci::{unpack, ImageConfig, Layer, PulledImage};

fn image(blobs: &std::path::Path, layers: Vec<Vec<u8>>) -> PulledImage {
    let layers = layers
        .into_iter()
        .enumerate()
        .map(|(i, data)| {
            let path = blobs.join(format!("layer{i}"));
            std::fs::write(&path, &data).unwrap();
            Layer {
                digest: format!("sha256:{i:064}"),
                media_type: TAR.into(),
                path,
                size: data.len() as u64,
            }
        })
        .collect();
    PulledImage {
        reference: "test/meta:1".into(),
        manifest_digest: String::new(),
        index_digest: None,
        layers,
        config: ImageConfig::default(),
    }
}

#[test]
fn pax_records_fifos_and_kind_changes_are_applied_and_devices_left_out() {
    if !warren_testkit::require("root (ownership, device nodes)", warren_testkit::is_root()) {
        return;
    }
    let long_name = format!("deep/{}/file", "d".repeat(150));
    let mut b = tar::Builder::new(Vec::new());
    b.append_pax_extensions([
        ("uid", &b"3000000"[..]),
        ("gid", &b"3000001"[..]),
        ("SCHILY.xattr.user.warren", &b"kept"[..]),
    ])
    .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o640);
    h.set_size(4);
    h.set_mtime(1_500_000_000);
    b.append_data(&mut h, "big-ids", &b"data"[..]).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(2);
    b.append_data(&mut h, &long_name, &b"ok"[..]).unwrap();
    for (name, kind, major, minor) in [
        ("dev/null", tar::EntryType::Char, 1, 3),
        ("dev/kmsg", tar::EntryType::Char, 1, 11),
        ("dev/disk", tar::EntryType::Block, 8, 0),
        ("dev/fifo", tar::EntryType::Fifo, 0, 0),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(0o666);
        h.set_size(0);
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        b.append_data(&mut h, name, &[][..]).unwrap();
    }
    let first = b.into_inner().unwrap();
    let lower = tar(&[
        Entry::File("dev/disk", b"a lower file the device replaces", 0o644, 0, 0),
        Entry::Dir("was-dir/", 0o755),
        Entry::File("was-dir/child", b"c", 0o644, 0, 0),
        Entry::File("was-file", b"f", 0o644, 0, 0),
    ]);
    let upper = tar(&[
        Entry::File("was-dir", b"now a file", 0o600, 0, 0),
        Entry::Dir("was-file/", 0o711),
        Entry::Symlink("was-file/inside", "../was-dir"),
    ]);

    let blobs = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let written = unpack(&image(blobs.path(), vec![lower, first, upper]), r).unwrap();
    assert_eq!(written, 32 + 4 + 2 + 1 + 1 + 10);

    let ids = std::fs::metadata(r.join("big-ids")).unwrap();
    assert_eq!(
        (ids.uid(), ids.gid()),
        (3_000_000, 3_000_001),
        "PAX uid/gid"
    );
    assert_eq!(ids.mode() & 0o7777, 0o640);
    assert_eq!(ids.mtime(), 1_500_000_000);
    // Where the filesystem takes user xattrs (ext4 and tmpfs do).
    if let Ok(Some(value)) = xattr::get(r.join("big-ids"), "user.warren") {
        assert_eq!(value, b"kept");
    } else {
        eprintln!("note: this filesystem keeps no user xattrs; not checked");
    }
    assert_eq!(std::fs::read_to_string(r.join(&long_name)).unwrap(), "ok");
    // An image's device nodes would be live wherever its tree is reachable on the host.
    for dev in ["dev/null", "dev/kmsg", "dev/disk"] {
        assert!(
            r.join(dev).symlink_metadata().is_err(),
            "{dev} is not made, and what a lower layer had there is gone"
        );
    }
    assert!(std::fs::metadata(r.join("dev/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());

    assert_eq!(
        std::fs::read_to_string(r.join("was-dir")).unwrap(),
        "now a file"
    );
    let was_file = std::fs::metadata(r.join("was-file")).unwrap();
    assert!(was_file.is_dir());
    assert_eq!(was_file.permissions().mode() & 0o7777, 0o711);
    assert_eq!(
        std::fs::read_link(r.join("was-file/inside")).unwrap(),
        std::path::Path::new("../was-dir")
    );
}

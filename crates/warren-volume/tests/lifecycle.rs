//! Volumes' lives: creation rules, remounting after a reboot, growth, snapshots, deletion.

mod common;

use std::process::Command;

use common::{harness, mounts_under, read_all, write, MIB};
use warren_volume::{ErrorKind, Quota, VolumeError, VolumeHost, MIN_BYTES, MIN_INODES};

#[test]
fn create_validates_and_refuses_duplicates() {
    let h = harness();
    let ok = Quota {
        bytes: MIN_BYTES,
        inodes: MIN_INODES,
    };
    for (id, quota) in [
        ("Bad_Id", ok),
        ("", ok),
        ("..", ok),
        (
            "small",
            Quota {
                bytes: MIN_BYTES - 1,
                inodes: MIN_INODES,
            },
        ),
        (
            "few",
            Quota {
                bytes: MIN_BYTES,
                inodes: MIN_INODES - 1,
            },
        ),
    ] {
        let e = h.host.create(id, quota).unwrap_err();
        assert!(matches!(e, VolumeError::InvalidArgument(_)), "{id}: {e:?}");
    }
    h.create("dup", MIN_BYTES, MIN_INODES);
    let e = h.host.create("dup", ok).unwrap_err();
    assert!(matches!(e, VolumeError::Exists(_)), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert!(h.host.exists("dup"));
    assert!(!h.host.exists("other"));
    assert!(!h.host.exists("../dup"));

    // The image is of the quota's size and allocated in full (tests/space.rs); the root
    // belongs to 1000:1000.
    let meta = std::fs::metadata(h.host.image_path("dup")).unwrap();
    assert_eq!(meta.len(), MIN_BYTES);
    assert!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512 >= MIN_BYTES);
    let usage = h.host.usage("dup").unwrap();
    assert!(
        usage.inodes_total >= MIN_INODES && usage.bytes_total > MIN_BYTES / 2,
        "{usage:?}"
    );
    // Nothing of the failed attempts was left behind.
    let staged = std::fs::read_dir(h.host.root().join(".staging"))
        .unwrap()
        .count();
    assert_eq!(staged, 0);
}

#[test]
fn data_survives_unmount_and_ensure_mounted() {
    let h = harness();
    let c = h.create("reboot", 16 * MIB, 256);
    write(&c, "/kept.txt", "still here").unwrap();
    let mount_point = c.mount_point().to_path_buf();
    drop(c);

    // What a reboot does to the mount; then a fresh host object, as after a restart.
    let status = Command::new("umount").arg(&mount_point).status().unwrap();
    assert!(status.success());
    assert!(mounts_under(&mount_point).is_empty());
    assert!(!mount_point.join("kept.txt").exists());
    let host = VolumeHost::open(h.host.root()).unwrap();
    assert!(host.exists("reboot"));
    assert_eq!(host.ensure_mounted("reboot").unwrap(), mount_point);
    assert_eq!(
        mounts_under(&mount_point),
        std::slice::from_ref(&mount_point)
    );
    // Cheap and idempotent when mounted: no second mount stacks up.
    host.ensure_mounted("reboot").unwrap();
    assert_eq!(mounts_under(&mount_point).len(), 1);
    assert_eq!(
        read_all(&host.content("reboot").unwrap(), "/kept.txt"),
        "still here"
    );

    // content() mounts on its own too.
    host.unmount("reboot").unwrap();
    assert!(mounts_under(&mount_point).is_empty());
    assert_eq!(
        read_all(&host.content("reboot").unwrap(), "kept.txt"),
        "still here"
    );
    assert!(matches!(
        host.ensure_mounted("missing"),
        Err(VolumeError::NotFound(_))
    ));
}

#[test]
fn grow_enlarges_online_and_refuses_to_shrink() {
    let h = harness();
    let c = h.create("grow", 16 * MIB, 256);
    write(&c, "/before.txt", "before").unwrap();
    let before = h.host.usage("grow").unwrap();
    assert!(before.bytes_total < 16 * MIB);

    // Without CAP_SYS_RESOURCE the grow is offline and needs the volume unused.
    drop(c);
    h.host.grow("grow", 64 * MIB).unwrap();
    let c = h.host.content("grow").unwrap();
    let after = h.host.usage("grow").unwrap();
    assert!(after.bytes_total > 56 * MIB, "{before:?} -> {after:?}");
    assert!(after.inodes_total >= before.inodes_total);
    assert_eq!(
        std::fs::metadata(h.host.image_path("grow")).unwrap().len(),
        64 * MIB
    );
    // A file larger than the old volume fits.
    let big = vec![7u8; 24 * MIB as usize];
    c.write_file("/big", &Default::default(), false, &mut big.as_slice())
        .unwrap();
    assert_eq!(read_all(&c, "/before.txt"), "before");

    let e = h.host.grow("grow", 32 * MIB).unwrap_err();
    assert!(
        matches!(e, VolumeError::InvalidArgument(ref m) if m.contains("shrink")),
        "{e:?}"
    );
    if online_resize_allowed() {
        // Online: growing with content open works.
        h.host.grow("grow", 72 * MIB).unwrap();
        assert!(h.host.usage("grow").unwrap().bytes_total > 64 * MIB);
    } else {
        // Offline: refused while in use, and the volume stays mounted and usable.
        let e = h.host.grow("grow", 72 * MIB).unwrap_err();
        assert!(
            matches!(e, VolumeError::Busy(ref m) if m.contains("in use"))
                && e.kind().http_status() == 409,
            "{e:?}"
        );
        assert_eq!(read_all(&c, "/before.txt"), "before");
        assert_eq!(
            read_all(&h.host.content("grow").unwrap(), "/before.txt"),
            "before"
        );
    }
    drop(c);
    // Growing to the current size is a harmless repeat (and finishes the refused grow above).
    h.host.grow("grow", 72 * MIB).unwrap();
    assert!(h.host.usage("grow").unwrap().bytes_total > 64 * MIB);
    assert!(matches!(
        h.host.grow("missing", 64 * MIB),
        Err(VolumeError::NotFound(_))
    ));
}

#[test]
fn snapshot_then_restore_shows_the_old_content() {
    let h = harness();
    let c = h.create("orig", 16 * MIB, 256);
    write(&c, "/f.txt", "version one").unwrap();

    let on_disk = h.host.snapshot("orig", "snap-1").unwrap();
    assert!(on_disk > 0 && on_disk < 16 * MIB, "{on_disk}");
    assert!(h.host.snapshot_path("snap-1").is_file());
    assert!(matches!(
        h.host.snapshot("orig", "snap-1"),
        Err(VolumeError::Exists(_))
    ));

    // Thawed: the volume takes writes again.
    write(&c, "/f.txt", "version two").unwrap();
    write(&c, "/g.txt", "new").unwrap();

    h.host.create_from_snapshot("snap-1", "restored").unwrap();
    let r = h.host.content("restored").unwrap();
    assert_eq!(read_all(&r, "/f.txt"), "version one");
    assert!(matches!(r.stat("/g.txt"), Err(VolumeError::NotFound(_))));
    write(&r, "/only-in-restored", "x").unwrap();
    assert_eq!(read_all(&c, "/f.txt"), "version two");
    assert!(matches!(
        c.stat("/only-in-restored"),
        Err(VolumeError::NotFound(_))
    ));
    assert_eq!(
        std::fs::metadata(h.host.image_path("restored"))
            .unwrap()
            .len(),
        16 * MIB
    );

    assert!(matches!(
        h.host.create_from_snapshot("nope", "x"),
        Err(VolumeError::NotFound(_))
    ));
    assert!(matches!(
        h.host.create_from_snapshot("snap-1", "orig"),
        Err(VolumeError::Exists(_))
    ));
    assert!(matches!(
        h.host.snapshot("missing", "snap-2"),
        Err(VolumeError::NotFound(_))
    ));

    h.host.delete_snapshot("snap-1").unwrap();
    assert!(!h.host.snapshot_path("snap-1").exists());
    h.host.delete_snapshot("snap-1").unwrap();
    // No temporary snapshot files remain.
    let left = std::fs::read_dir(h.host.root().join(".snapshots"))
        .unwrap()
        .count();
    assert_eq!(left, 0);
}

#[test]
fn delete_unmounts_and_removes_everything() {
    let h = harness();
    let c = h.create("doomed", 16 * MIB, 256);
    write(&c, "/x", "x").unwrap();
    let dir = h.host.root().join("doomed");
    let mount_point = h.host.mount_point("doomed");
    assert_eq!(mounts_under(&dir), std::slice::from_ref(&mount_point));

    // Still holding the volume open: the unmount falls back to a lazy detach.
    h.host.delete("doomed").unwrap();
    assert!(mounts_under(&dir).is_empty());
    assert!(!dir.exists());
    assert!(!h.host.exists("doomed"));
    drop(c);
    h.host.delete("doomed").unwrap();
    assert!(matches!(
        h.host.ensure_mounted("doomed"),
        Err(VolumeError::NotFound(_))
    ));
    assert!(matches!(
        h.host.content("doomed"),
        Err(VolumeError::NotFound(_))
    ));
    assert!(matches!(
        h.host.usage("doomed"),
        Err(VolumeError::NotFound(_))
    ));

    // A second volume, idle, is deleted with a plain unmount.
    h.create("doomed-too", 16 * MIB, 256);
    h.host.delete("doomed-too").unwrap();
    assert!(h.mounts().is_empty());
    let left: Vec<_> = std::fs::read_dir(h.host.root())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| !n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Whether this process has CAP_SYS_RESOURCE (the kernel's online ext4 resize needs it).
fn online_resize_allowed() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    let allowed = caps & (1 << 24) != 0;
    eprintln!("online resize allowed: {allowed}");
    allowed
}

#[test]
fn more_inodes_than_the_size_can_hold_is_a_clear_error() {
    let h = harness();
    let e = h
        .host
        .create(
            "inodes",
            Quota {
                bytes: 32 * MIB,
                inodes: 1 << 20,
            },
        )
        .unwrap_err();
    assert!(
        matches!(e, VolumeError::InvalidArgument(ref m) if m.contains("at most 32768 inodes")),
        "{e:?}"
    );
    assert_eq!(e.kind(), ErrorKind::BadRequest);
    assert!(h.host.volume_ids().unwrap().is_empty());
}

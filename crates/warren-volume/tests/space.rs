//! Volumes own their size on the host's disk: an image is allocated in full when it is made or
//! grown, discards cannot give that space back, and a volume, grow or snapshot the disk cannot
//! hold (keeping the server's reserve free) is refused up front with the numbers, leaving
//! nothing behind.

mod common;

use std::io::Read;
use std::process::Command;

use common::{allocated, harness, harness_on_small_disk, write, MIB};
use warren_volume::{ErrorKind, Owner, Quota, VolumeError};

fn quota(mib: u64) -> Quota {
    Quota {
        bytes: mib * MIB,
        inodes: 1024,
    }
}

#[test]
fn a_volume_takes_its_whole_size_on_the_host_disk_and_keeps_it_through_fstrim() {
    let h = harness();
    let c = h.create("whole", 64 * MIB, 1024);
    let image = h.host.image_path("whole");
    assert!(
        allocated(&image) >= 64 * MIB,
        "a new volume's image takes {} bytes of the host's disk, not its 64 MiB",
        allocated(&image)
    );
    // A file written and removed, then the host's periodic trim: the space stays the volume's.
    let mut data = std::io::repeat(0x5a).take(16 * MIB);
    c.write_file("/big", &Owner::default(), false, &mut data)
        .unwrap();
    c.remove("/big").unwrap();
    let _ = Command::new("fstrim")
        .arg(h.host.mount_point("whole"))
        .status();
    assert!(
        allocated(&image) >= 64 * MIB,
        "after fstrim the image takes {} bytes: a discard gave the volume's space back",
        allocated(&image)
    );
    // Without CAP_SYS_RESOURCE a grow is offline and needs the volume unused.
    drop(c);
    h.host.grow("whole", 96 * MIB).unwrap();
    assert!(
        allocated(&image) >= 96 * MIB,
        "a grown volume is allocated in full"
    );
    // A snapshot copies what is used, not the allocation.
    let on_disk = h.host.snapshot("whole", "snap").unwrap();
    assert!(
        on_disk < 48 * MIB,
        "a nearly empty volume's snapshot takes {on_disk} bytes"
    );
    h.host.create_from_snapshot("snap", "fromsnap").unwrap();
    assert!(allocated(&h.host.image_path("fromsnap")) >= 96 * MIB);
    h.host.delete_snapshot("snap").unwrap();
}

#[test]
fn what_the_host_disk_cannot_hold_is_refused_with_the_numbers_and_leaves_nothing() {
    // 160 MiB of disk, 32 of them kept free: room for 128 MiB of volumes.
    let h = harness_on_small_disk(160, 32);
    let c = h.create("first", 96 * MIB, 1024);
    write(&c, "/kept", "still here").unwrap();

    let e = h.host.create("second", quota(64)).unwrap_err();
    assert!(matches!(e, VolumeError::HostFull { .. }), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::InsufficientStorage);
    assert_eq!(e.kind().http_status(), 507);
    let msg = e.to_string();
    assert!(
        msg.contains(&(64 * MIB).to_string()) && msg.contains("free"),
        "{msg}"
    );
    assert!(!h.host.exists("second"), "a refused volume left an image");
    let names: Vec<_> = std::fs::read_dir(h.host.root())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(names, ["first"], "only the first volume is on the disk");

    // What fits still fits; a grow past the room is refused and leaves the size as it was.
    h.host.create("small", quota(16)).unwrap();
    let e = h.host.grow("first", 128 * MIB).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InsufficientStorage, "{e:?}");
    assert_eq!(
        std::fs::metadata(h.host.image_path("first")).unwrap().len(),
        96 * MIB
    );
    drop(c);
    h.host.grow("first", 104 * MIB).unwrap();
    let c = h.host.content("first").unwrap();

    // A snapshot needs room for what the volume uses.
    let mut data = std::io::repeat(0x33).take(40 * MIB);
    c.write_file("/fill", &Owner::default(), false, &mut data)
        .unwrap();
    let e = h.host.snapshot("first", "s1").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InsufficientStorage, "{e:?}");
    assert!(!h.host.snapshot_path("s1").exists());

    // Writes inside a volume never see the host's disk full: its space is its own.
    let mut rest = std::io::repeat(0x44).take(40 * MIB);
    c.write_file("/more", &Owner::default(), false, &mut rest)
        .unwrap();
    assert_eq!(common::read_all(&c, "/kept"), "still here");
}

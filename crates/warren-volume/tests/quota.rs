//! Quotas are the filesystem's size: running out of bytes or inodes is NoSpace, and a failed
//! write leaves nothing behind.

mod common;

use std::io::Read;

use common::{harness, write, MIB};
use warren_volume::{ErrorKind, Owner, VolumeError, MIN_BYTES};

#[test]
fn writing_past_the_byte_quota_is_no_space_and_leaves_no_temp_file() {
    let h = harness();
    let c = h.create("bytes", MIN_BYTES, 256);
    write(&c, "/small", "fits").unwrap();
    let baseline = h.host.usage("bytes").unwrap();

    let mut too_big = std::io::repeat(0xab).take(2 * MIN_BYTES);
    let e = c
        .write_file("/huge", &Owner::default(), false, &mut too_big)
        .unwrap_err();
    assert!(matches!(e, VolumeError::NoSpace), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::InsufficientStorage);
    assert_eq!(e.kind().http_status(), 507);

    let names: Vec<String> = c
        .list("/", 1)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["lost+found", "small"]);
    let after = h.host.usage("bytes").unwrap();
    assert!(
        after.bytes_used <= baseline.bytes_used + 64 * 1024,
        "space not given back: {baseline:?} -> {after:?}"
    );
    assert_eq!(after.inodes_used, baseline.inodes_used);
    // The volume is usable afterwards.
    write(&c, "/after", "ok").unwrap();
    // Replacing a file with one too large keeps the old content.
    let mut too_big = std::io::repeat(0xcd).take(2 * MIN_BYTES);
    assert!(matches!(
        c.write_file("/small", &Owner::default(), true, &mut too_big),
        Err(VolumeError::NoSpace)
    ));
    assert_eq!(common::read_all(&c, "/small"), "fits");
}

#[test]
fn running_out_of_inodes_is_no_space() {
    let h = harness();
    let c = h.create("inodes", 16 * MIB, 64);
    let total = h.host.usage("inodes").unwrap().inodes_total;
    assert!((64..128).contains(&total), "inodes_total {total}");

    let mut made = 0u64;
    let err = loop {
        match write(&c, &format!("/f{made}"), "") {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(
            made <= total,
            "made {made} files on a volume of {total} inodes"
        );
    };
    assert!(matches!(err, VolumeError::NoSpace), "{err:?}");
    assert!(made > 32, "only {made} files fit");
    let usage = h.host.usage("inodes").unwrap();
    assert_eq!(usage.inodes_used, usage.inodes_total, "{usage:?}");
    assert!(matches!(
        c.make_dir("/d", &Owner::default(), false),
        Err(VolumeError::NoSpace)
    ));

    // Freeing one inode makes room for one more.
    c.remove("/f0").unwrap();
    write(&c, "/again", "").unwrap();
}

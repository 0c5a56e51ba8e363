//! What a sandbox can leave in its volume must never let the content API reach outside it:
//! symlinks out (absolute and with `..`), device nodes, FIFOs.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use common::{harness, read_all, write, MIB};
use rustix::fs::{FileType, Mode, CWD};
use warren_volume::{EntryKind, Owner, VolumeError};

fn assert_escape<T: std::fmt::Debug>(what: &str, r: Result<T, VolumeError>) {
    match r {
        Err(VolumeError::Escape(_)) => {}
        other => panic!("{what}: expected Escape, got {other:?}"),
    }
}

#[test]
fn symlinks_out_of_the_volume_touch_nothing_outside() {
    let h = harness();
    let c = h.create("hostile", 16 * MIB, 256);
    let mp = c.mount_point().to_path_buf();

    // Outside the volume: <tmp>/outside/secret, root-owned 0600.
    let outside = h.tmp().join("outside");
    fs::create_dir(&outside).unwrap();
    let secret = outside.join("secret");
    fs::write(&secret, "keep me").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let snapshot = |p: &Path| {
        let m = fs::symlink_metadata(p).unwrap();
        (
            fs::read(p).unwrap(),
            m.mode(),
            m.uid(),
            m.gid(),
            m.mtime_nsec(),
            m.ctime_nsec(),
        )
    };
    let secret_before = snapshot(&secret);
    let etc_before = fs::symlink_metadata("/etc").unwrap();

    // <mp> is <tmp>/volumes/hostile/data, so ../../.. is <tmp>.
    symlink(&outside, mp.join("abs")).unwrap();
    symlink("/etc", mp.join("etc")).unwrap();
    symlink("/etc/passwd", mp.join("passwd")).unwrap();
    symlink("../../..", mp.join("up")).unwrap();
    symlink("../../../outside/secret", mp.join("upfile")).unwrap();
    fs::create_dir(mp.join("sub")).unwrap();
    symlink("../../../../outside", mp.join("sub/deep")).unwrap();
    assert!(
        mp.join("up/outside/secret").is_file(),
        "the test's links must really point out"
    );

    // The links themselves can be looked at.
    let st = c.stat("/etc").unwrap();
    assert_eq!(
        (st.kind, st.target.as_deref()),
        (EntryKind::Symlink, Some("/etc"))
    );
    let st = c.stat("/up").unwrap();
    assert_eq!(
        (st.kind, st.target.as_deref()),
        (EntryKind::Symlink, Some("../../.."))
    );
    assert_eq!(c.stat("/abs").unwrap().kind, EntryKind::Symlink);

    // Reading through them.
    assert_escape("open /passwd", c.open_file("/passwd"));
    assert_escape("open /etc/passwd", c.open_file("/etc/passwd"));
    assert_escape("open /upfile", c.open_file("/upfile"));
    assert_escape("open /up/outside/secret", c.open_file("/up/outside/secret"));
    assert_escape("open /abs/secret", c.open_file("/abs/secret"));
    assert_escape("open /sub/deep/secret", c.open_file("/sub/deep/secret"));
    assert_escape("stat /up/outside/secret", c.stat("/up/outside/secret"));
    assert_escape("stat /etc/passwd", c.stat("/etc/passwd"));

    // Listing through them.
    assert_escape("list /up", c.list("/up", 1));
    assert_escape("list /etc", c.list("/etc", 1));
    assert_escape("list /abs", c.list("/abs", 2));
    assert_escape("list /sub/deep", c.list("/sub/deep", 1));
    // A deep listing of the volume lists the links but never descends into them.
    let all: Vec<String> = c
        .list("/", 16)
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert!(all.contains(&"/up".to_string()) && all.contains(&"/sub/deep".to_string()));
    assert!(
        all.iter()
            .all(|p| !p.starts_with("/up/") && !p.starts_with("/abs/") && !p.starts_with("/etc/")),
        "{all:?}"
    );

    // Writing through them.
    assert_escape(
        "write /up/outside/secret",
        write(&c, "/up/outside/secret", "pwned"),
    );
    assert_escape("write /abs/new", write(&c, "/abs/new", "pwned"));
    assert_escape(
        "write /etc/...",
        write(&c, "/etc/warren-volume-test", "pwned"),
    );
    assert_escape("write /sub/deep/new", write(&c, "/sub/deep/new", "pwned"));
    assert_escape(
        "make_dir /abs/newdir",
        c.make_dir("/abs/newdir/inner", &Owner::default(), true),
    );
    assert_escape(
        "make_dir /up/x",
        c.make_dir("/up/x", &Owner::default(), false),
    );
    assert!(!outside.join("new").exists());
    assert!(!outside.join("newdir").exists());
    assert!(!Path::new("/etc/warren-volume-test").exists());
    assert!(!h.tmp().join("x").exists());

    // Changing metadata through them.
    let chmod = Owner {
        uid: Some(1234),
        gid: Some(1234),
        mode: Some(0o777),
    };
    assert_escape(
        "set_metadata /up/outside/secret",
        c.set_metadata("/up/outside/secret", &chmod),
    );
    assert_escape(
        "set_metadata /abs/secret",
        c.set_metadata("/abs/secret", &chmod),
    );
    assert_escape(
        "set_metadata /etc/passwd",
        c.set_metadata("/etc/passwd", &chmod),
    );
    // On the link itself: the link's owner changes, the target's does not; a link has no mode.
    let chown = Owner {
        uid: Some(1234),
        gid: Some(1234),
        mode: None,
    };
    let st = c.set_metadata("/upfile", &chown).unwrap();
    assert_eq!((st.kind, st.uid, st.gid), (EntryKind::Symlink, 1234, 1234));
    let st = c.set_metadata("/etc", &chown).unwrap();
    assert_eq!((st.kind, st.uid), (EntryKind::Symlink, 1234));
    assert!(matches!(
        c.set_metadata("/upfile", &chmod),
        Err(VolumeError::InvalidArgument(_))
    ));

    // Removing through them.
    assert_escape("remove /up/outside/secret", c.remove("/up/outside/secret"));
    assert_escape("remove /abs/secret", c.remove("/abs/secret"));
    assert_escape("remove /up/outside", c.remove("/up/outside"));
    assert_escape("remove /etc/hostname", c.remove("/etc/hostname"));
    // Removing the links removes the links only; removing a directory holding one does not
    // follow it.
    c.remove("/up").unwrap();
    c.remove("/abs").unwrap();
    c.remove("/upfile").unwrap();
    c.remove("/etc").unwrap();
    c.remove("/sub").unwrap();
    // Overwriting a link replaces the link in the volume, never its target.
    symlink("../../../outside/secret", mp.join("upfile")).unwrap();
    write(&c, "/upfile", "replaced").unwrap();
    assert_eq!(c.stat("/upfile").unwrap().kind, EntryKind::File);
    assert_eq!(read_all(&c, "/upfile"), "replaced");

    assert_eq!(snapshot(&secret), secret_before, "the outside file changed");
    assert!(outside.is_dir());
    let etc_after = fs::symlink_metadata("/etc").unwrap();
    assert_eq!(
        (etc_after.mode(), etc_after.uid(), etc_after.gid()),
        (etc_before.mode(), etc_before.uid(), etc_before.gid())
    );
    assert!(Path::new("/etc/passwd").is_file() && Path::new("/etc/hostname").exists());
}

#[test]
fn devices_and_fifos_are_not_files() {
    let h = harness();
    let c = h.create("devices", 16 * MIB, 256);
    let mp = c.mount_point().to_path_buf();

    // What a root process could leave in the volume: /dev/null's twin and a FIFO.
    rustix::fs::mknodat(
        CWD,
        mp.join("null"),
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .expect("mknod in the mounted volume");
    rustix::fs::mknodat(
        CWD,
        mp.join("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo in the mounted volume");
    symlink("null", mp.join("null-link")).unwrap();

    assert_eq!(c.stat("/null").unwrap().kind, EntryKind::Unknown);
    assert_eq!(c.stat("/fifo").unwrap().kind, EntryKind::Unknown);
    for p in ["/null", "/fifo", "/null-link"] {
        let e = c.open_file(p).unwrap_err();
        assert!(matches!(e, VolumeError::NotAFile(_)), "{p}: {e:?}");
    }
    // Owners can change; a device's mode cannot be (it cannot be opened on a nodev mount); a
    // FIFO's can.
    let st = c
        .set_metadata(
            "/null",
            &Owner {
                uid: Some(1001),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(st.uid, 1001);
    assert!(matches!(
        c.set_metadata(
            "/null",
            &Owner {
                mode: Some(0o600),
                ..Default::default()
            }
        ),
        Err(VolumeError::NotAFile(_))
    ));
    let st = c
        .set_metadata(
            "/fifo",
            &Owner {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(st.mode, 0o600);
    // Writing over a device replaces the node, it never writes into the device.
    write(&c, "/null", "a file now").unwrap();
    assert_eq!(read_all(&c, "/null"), "a file now");
    c.remove("/fifo").unwrap();
    c.remove("/null-link").unwrap();
}

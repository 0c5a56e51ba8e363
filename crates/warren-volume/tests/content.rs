//! Content operations on a real volume: writes, stats, listings, directories, metadata,
//! removal, path normalisation.

mod common;

use common::{harness, read_all, write, MIB};
use warren_volume::{EntryKind, ErrorKind, Owner, VolumeError};

#[test]
fn content_round_trip() {
    let h = harness();
    let c = h.create("round-trip", 32 * MIB, 1024);

    let root = c.stat("/").unwrap();
    assert_eq!(
        (root.kind, root.uid, root.gid, root.mode),
        (EntryKind::Directory, 1000, 1000, 0o755)
    );
    assert_eq!(root.path, "/");

    // A new file: defaults from the parent, 0644.
    let st = c
        .write_file("/hello.txt", &Owner::default(), false, &mut "hi".as_bytes())
        .unwrap();
    assert_eq!(
        (st.kind, st.size, st.mode, st.uid, st.gid),
        (EntryKind::File, 2, 0o644, 1000, 1000)
    );
    assert_eq!(
        (st.name.as_str(), st.path.as_str()),
        ("hello.txt", "/hello.txt")
    );
    assert!(st.mtime > std::time::UNIX_EPOCH);

    // Exists without overwrite: 409; with overwrite: replaced.
    let e = c
        .write_file("/hello.txt", &Owner::default(), false, &mut "no".as_bytes())
        .unwrap_err();
    assert!(
        matches!(e, VolumeError::Exists(ref p) if p == "/hello.txt"),
        "{e:?}"
    );
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert_eq!(e.kind().http_status(), 409);
    assert_eq!(read_all(&c, "/hello.txt"), "hi");
    assert_eq!(write(&c, "hello.txt", "bye!").unwrap().size, 4);
    assert_eq!(read_all(&c, "/hello.txt"), "bye!");

    // make_dir without and with parents; parents get the same owner.
    let owner = Owner {
        uid: Some(1001),
        gid: Some(1002),
        mode: Some(0o700),
    };
    let e = c.make_dir("/a/b/c", &owner, false).unwrap_err();
    assert!(matches!(e, VolumeError::NotFound(_)), "{e:?}");
    assert_eq!(e.kind().http_status(), 404);
    let st = c.make_dir("/a/b/c", &owner, true).unwrap();
    assert_eq!(
        (st.kind, st.path.as_str()),
        (EntryKind::Directory, "/a/b/c")
    );
    for p in ["/a", "/a/b", "/a/b/c"] {
        let st = c.stat(p).unwrap();
        assert_eq!((st.uid, st.gid, st.mode), (1001, 1002, 0o700), "{p}");
    }
    assert!(matches!(
        c.make_dir("/a", &Owner::default(), false),
        Err(VolumeError::Exists(_))
    ));
    assert_eq!(
        c.make_dir("/a", &Owner::default(), true).unwrap().path,
        "/a"
    );
    assert!(matches!(
        c.make_dir("/", &Owner::default(), false),
        Err(VolumeError::Exists(_))
    ));
    assert!(matches!(
        c.make_dir("/hello.txt/x", &Owner::default(), true),
        Err(VolumeError::NotADirectory(_))
    ));
    assert!(matches!(
        c.make_dir("/hello.txt", &Owner::default(), true),
        Err(VolumeError::Exists(_))
    ));
    let st = c.make_dir("/plain", &Owner::default(), false).unwrap();
    assert_eq!((st.uid, st.gid, st.mode), (1000, 1000, 0o755));

    // write_file's other refusals.
    assert!(matches!(
        write(&c, "/a", "x"),
        Err(VolumeError::IsADirectory(_))
    ));
    assert!(matches!(
        write(&c, "/", "x"),
        Err(VolumeError::IsADirectory(_))
    ));
    assert!(matches!(
        write(&c, "/nope/x", "x"),
        Err(VolumeError::NotFound(_))
    ));
    assert!(matches!(
        write(&c, "/hello.txt/x", "x"),
        Err(VolumeError::NotADirectory(_))
    ));

    // Defaults fill only the gaps.
    let st = c
        .write_file(
            "a/b/f.txt",
            &Owner {
                uid: Some(1005),
                gid: None,
                mode: Some(0o600),
            },
            false,
            &mut "deep".as_bytes(),
        )
        .unwrap();
    assert_eq!(
        (st.uid, st.gid, st.mode, st.path.as_str()),
        (1005, 1002, 0o600, "/a/b/f.txt")
    );

    // Listings, sorted by path, depth-limited.
    let paths = |depth| -> Vec<String> {
        c.list("/", depth)
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect()
    };
    assert_eq!(paths(1), ["/a", "/hello.txt", "/lost+found", "/plain"]);
    assert_eq!(
        paths(2),
        ["/a", "/a/b", "/hello.txt", "/lost+found", "/plain"]
    );
    assert_eq!(
        paths(3),
        [
            "/a",
            "/a/b",
            "/a/b/c",
            "/a/b/f.txt",
            "/hello.txt",
            "/lost+found",
            "/plain"
        ]
    );
    let sub = c.list("/a/b", 1).unwrap();
    assert_eq!(
        sub.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["c", "f.txt"]
    );
    assert_eq!(sub[1].size, 4);
    assert!(matches!(
        c.list("/hello.txt", 1),
        Err(VolumeError::NotADirectory(_))
    ));
    assert!(matches!(
        c.list("/missing", 1),
        Err(VolumeError::NotFound(_))
    ));
    assert!(matches!(
        c.list("/", 0),
        Err(VolumeError::InvalidArgument(_))
    ));

    // set_metadata: None leaves a field alone; out-of-range values are refused.
    let st = c
        .set_metadata(
            "/hello.txt",
            &Owner {
                uid: Some(2000),
                gid: None,
                mode: Some(0o640),
            },
        )
        .unwrap();
    assert_eq!((st.uid, st.gid, st.mode), (2000, 1000, 0o640));
    let st = c
        .set_metadata(
            "/a",
            &Owner {
                uid: None,
                gid: Some(3000),
                mode: None,
            },
        )
        .unwrap();
    assert_eq!((st.uid, st.gid, st.mode), (1001, 3000, 0o700));
    let st = c
        .set_metadata(
            "/",
            &Owner {
                uid: None,
                gid: None,
                mode: Some(0o775),
            },
        )
        .unwrap();
    assert_eq!(st.mode, 0o775);
    for bad in [
        Owner {
            uid: Some(65536),
            ..Default::default()
        },
        Owner {
            gid: Some(u32::MAX),
            ..Default::default()
        },
        Owner {
            mode: Some(0o10000),
            ..Default::default()
        },
    ] {
        let e = c.set_metadata("/hello.txt", &bad).unwrap_err();
        assert!(matches!(e, VolumeError::InvalidArgument(_)), "{e:?}");
        assert_eq!(e.kind().http_status(), 400);
        assert!(matches!(
            write_with(&c, "/new", &bad),
            Err(VolumeError::InvalidArgument(_))
        ));
    }
    assert!(matches!(
        c.set_metadata("/missing", &Owner::default()),
        Err(VolumeError::NotFound(_))
    ));

    // A symlink inside the volume: described as itself, followed for listing and reading while
    // it stays inside, chowned as itself.
    std::os::unix::fs::symlink("b", c.mount_point().join("a/link")).unwrap();
    std::os::unix::fs::symlink("a/b/f.txt", c.mount_point().join("flink")).unwrap();
    let st = c.stat("/a/link").unwrap();
    assert_eq!(
        (st.kind, st.target.as_deref()),
        (EntryKind::Symlink, Some("b"))
    );
    let via: Vec<String> = c
        .list("/a/link", 1)
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(via, ["/a/link/c", "/a/link/f.txt"]);
    assert_eq!(read_all(&c, "/flink"), "deep");
    let st = c
        .set_metadata(
            "/a/link",
            &Owner {
                uid: Some(1234),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((st.kind, st.uid), (EntryKind::Symlink, 1234));
    assert_eq!(c.stat("/a/b").unwrap().uid, 1001);
    assert!(matches!(
        c.set_metadata(
            "/a/link",
            &Owner {
                mode: Some(0o777),
                ..Default::default()
            }
        ),
        Err(VolumeError::InvalidArgument(_))
    ));
    // Overwriting a symlink replaces the link, not its target.
    write(&c, "/flink", "replaced").unwrap();
    assert_eq!(c.stat("/flink").unwrap().kind, EntryKind::File);
    assert_eq!(read_all(&c, "/a/b/f.txt"), "deep");

    // open_file wants regular files.
    assert!(matches!(c.open_file("/a"), Err(VolumeError::NotAFile(_))));
    assert!(matches!(c.open_file("/"), Err(VolumeError::NotAFile(_))));
    assert!(matches!(
        c.open_file("/missing"),
        Err(VolumeError::NotFound(_))
    ));

    // Removal: recursive, never the root, NotFound when missing, links as themselves.
    c.remove("/a/link").unwrap();
    assert!(c.stat("/a/b").is_ok());
    c.remove("/a").unwrap();
    assert!(matches!(c.stat("/a"), Err(VolumeError::NotFound(_))));
    assert!(matches!(c.stat("/a/b/c"), Err(VolumeError::NotFound(_))));
    let e = c.remove("/").unwrap_err();
    assert!(matches!(e, VolumeError::InvalidPath(_)), "{e:?}");
    assert!(matches!(c.remove("/.."), Err(VolumeError::InvalidPath(_))));
    assert!(matches!(
        c.remove("/missing"),
        Err(VolumeError::NotFound(_))
    ));
    c.remove("/hello.txt").unwrap();

    // No temporary files were left by any of this.
    let names: Vec<String> = c
        .list("/", 8)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.iter().all(|n| !n.starts_with(".warren")), "{names:?}");
}

fn write_with(
    c: &warren_volume::Content,
    path: &str,
    owner: &Owner,
) -> Result<warren_volume::EntryStat, VolumeError> {
    c.write_file(path, owner, false, &mut "x".as_bytes())
}

#[test]
fn paths_normalise_lexically_and_never_climb_out() {
    let h = harness();
    let c = h.create("normalise", 16 * MIB, 256);
    for p in ["/..", "..", "/../..", "", ".", "/./"] {
        let st = c.stat(p).unwrap();
        assert_eq!(
            (st.path.as_str(), st.kind),
            ("/", EntryKind::Directory),
            "{p}"
        );
    }
    let st = write(&c, "/../../escape.txt", "inside").unwrap();
    assert_eq!(st.path, "/escape.txt");
    assert!(c.mount_point().join("escape.txt").is_file());
    assert!(!h.tmp().join("escape.txt").exists());
    assert!(!h.host.root().join("escape.txt").exists());
    c.make_dir("x/y", &Owner::default(), true).unwrap();
    assert_eq!(c.stat("x/./y/../y/").unwrap().path, "/x/y");
    assert_eq!(read_all(&c, "x/../escape.txt"), "inside");
    let e = c.stat("a\0b").unwrap_err();
    assert!(matches!(e, VolumeError::InvalidPath(_)), "{e:?}");
}

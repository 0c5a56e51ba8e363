//! The NFSv3 procedures through a real client against a loop-mounted ext4 volume.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;
use nfs3_client::nfs3_types::nfs3::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_round_trip_and_directory_ops() {
    let vol = ext4(64);
    let srv = start(vec![export("/v0", &vol.mnt, false)], KEY).await;
    let mut c = mount(srv.addr, "/v0", Some((0, 0, vec![]))).await;
    let root = c.root.clone();
    assert_eq!(c.readdir(&root).await.unwrap(), vec![".", ".."]);

    // Write FILE_SYNC, then UNSTABLE + COMMIT, and read it all back.
    let f = c.create(&root, "data.bin", 0o640).await.unwrap();
    let a = pattern(300_000, 1);
    let b = pattern(1 << 20, 2);
    let w = c.write(&f, 0, &a, stable_how::FILE_SYNC).await.unwrap();
    assert_eq!(w.committed, stable_how::FILE_SYNC);
    assert_eq!(w.count, a.len() as u32);
    let w2 = c
        .write(&f, a.len() as u64, &b, stable_how::UNSTABLE)
        .await
        .unwrap();
    assert_eq!(c.commit(&f).await.unwrap(), w2.verf);
    let mut back = Vec::new();
    loop {
        let (chunk, eof) = c.read(&f, back.len() as u64, 1 << 20).await.unwrap();
        back.extend_from_slice(&chunk);
        if eof {
            break;
        }
        assert!(!chunk.is_empty());
    }
    let want: Vec<u8> = [a.clone(), b.clone()].concat();
    assert_eq!(sum(&back), sum(&want));
    assert_eq!(back.len(), want.len());
    let host = std::fs::read(vol.mnt.join("data.bin")).unwrap();
    assert_eq!(sum(&host), sum(&want));
    let md = std::fs::metadata(vol.mnt.join("data.bin")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o640);
    // Reads past the end: nothing, eof.
    let (none, eof) = c.read(&f, 10 << 20, 100).await.unwrap();
    assert!(none.is_empty() && eof);

    // Directories, rename, remove, rmdir.
    let d = c.mkdir(&root, "dir", 0o750).await.unwrap();
    assert_eq!(c.getattr(&d).await.unwrap().mode, 0o750);
    assert_eq!(c.getattr(&d).await.unwrap().type_, ftype3::NF3DIR);
    c.rename(&root, "data.bin", &d, "moved.bin").await.unwrap();
    assert_eq!(
        c.lookup(&root, "data.bin").await,
        Err(nfsstat3::NFS3ERR_NOENT)
    );
    let moved = c.lookup(&d, "moved.bin").await.unwrap();
    assert_eq!(moved, f, "a handle names the object, not the path");
    assert_eq!(c.rmdir(&root, "dir").await, Err(nfsstat3::NFS3ERR_NOTEMPTY));
    assert_eq!(c.lookup(&d, "..").await.unwrap(), root);

    // Symlinks are stored and read back, never followed.
    let l = c.symlink(&d, "ln", "../some/where").await.unwrap();
    assert_eq!(c.readlink(&l).await.unwrap(), b"../some/where");
    assert_eq!(c.getattr(&l).await.unwrap().type_, ftype3::NF3LNK);
    assert_eq!(
        std::fs::read_link(vol.mnt.join("dir/ln")).unwrap(),
        std::path::Path::new("../some/where")
    );

    // Hard links.
    c.link(&moved, &root, "hard").await.unwrap();
    assert_eq!(c.getattr(&moved).await.unwrap().nlink, 2);
    assert_eq!(
        std::fs::metadata(vol.mnt.join("hard")).unwrap().ino(),
        std::fs::metadata(vol.mnt.join("dir/moved.bin"))
            .unwrap()
            .ino()
    );

    // SETATTR: mode, size (truncate), times.
    c.setattr(&moved, mode(0o600)).await.unwrap();
    c.setattr(
        &moved,
        sattr3 {
            size: set_size3::Some(1000),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let t = nfstime3 {
        seconds: 1_000_000_000,
        nseconds: 5,
    };
    c.setattr(
        &moved,
        sattr3 {
            atime: set_atime::SET_TO_CLIENT_TIME(t),
            mtime: set_mtime::SET_TO_CLIENT_TIME(t),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let at = c.getattr(&moved).await.unwrap();
    assert_eq!((at.mode, at.size, at.mtime, at.atime), (0o600, 1000, t, t));
    let md = std::fs::metadata(vol.mnt.join("hard")).unwrap();
    assert_eq!(
        (md.len(), md.mtime(), md.mode() & 0o7777),
        (1000, 1_000_000_000, 0o600)
    );

    // READDIR and READDIRPLUS over several pages.
    for i in 0..40 {
        c.create(&d, &format!("f{i:02}"), 0o644).await.unwrap();
    }
    let names = c.readdir(&d).await.unwrap();
    assert_eq!(names.len(), 40 + 4, "{names:?}");
    let plus = c.readdirplus(&d).await.unwrap();
    assert_eq!(plus.len(), 44);
    let f07 = plus
        .iter()
        .find(|(n, _)| n == "f07")
        .unwrap()
        .1
        .clone()
        .unwrap();
    assert_eq!(c.lookup(&d, "f07").await.unwrap(), f07);

    // Remove, rmdir.
    for i in 0..40 {
        c.remove(&d, &format!("f{i:02}")).await.unwrap();
    }
    c.remove(&d, "moved.bin").await.unwrap();
    c.remove(&d, "ln").await.unwrap();
    assert_eq!(c.getattr(&moved).await.unwrap().nlink, 1);
    c.rmdir(&root, "dir").await.unwrap();
    assert_eq!(err(c.getattr(&d).await), Some(nfsstat3::NFS3ERR_STALE));
    assert_eq!(c.readdir(&root).await.unwrap(), vec![".", "..", "hard"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_modes_mknod_and_fsstat() {
    let vol = ext4(32);
    let srv = start(vec![export("/v0", &vol.mnt, false)], KEY).await;
    let mut c = mount(srv.addr, "/v0", Some((0, 0, vec![]))).await;
    let root = c.root.clone();

    // GUARDED refuses an existing name; UNCHECKED keeps the file (and truncates if asked).
    let f = c
        .create_how(&root, "g", createhow3::GUARDED(mode(0o644)))
        .await
        .unwrap();
    c.write(&f, 0, b"hello", stable_how::FILE_SYNC)
        .await
        .unwrap();
    assert_eq!(
        c.create_how(&root, "g", createhow3::GUARDED(mode(0o644)))
            .await,
        Err(nfsstat3::NFS3ERR_EXIST)
    );
    assert_eq!(c.create(&root, "g", 0o600).await.unwrap(), f);
    assert_eq!(c.getattr(&f).await.unwrap().size, 5);
    // EXCLUSIVE: a retransmission with the same verifier succeeds, another verifier does not.
    let v = createverf3([1, 2, 3, 4, 5, 6, 7, 8]);
    let e1 = c
        .create_how(&root, "x", createhow3::EXCLUSIVE(v))
        .await
        .unwrap();
    let e2 = c
        .create_how(&root, "x", createhow3::EXCLUSIVE(v))
        .await
        .unwrap();
    assert_eq!(e1, e2);
    assert_eq!(
        c.create_how(&root, "x", createhow3::EXCLUSIVE(createverf3([9; 8])))
            .await,
        Err(nfsstat3::NFS3ERR_EXIST)
    );

    // FIFOs and sockets are made; device nodes are refused.
    let fifo = c
        .mknod(&root, "fifo", mknoddata3::NF3FIFO(mode(0o600)))
        .await
        .unwrap();
    assert_eq!(c.getattr(&fifo).await.unwrap().type_, ftype3::NF3FIFO);
    let dev = devicedata3 {
        dev_attributes: mode(0o600),
        spec: specdata3 {
            specdata1: 1,
            specdata2: 3,
        },
    };
    assert_eq!(
        c.mknod(&root, "null", mknoddata3::NF3CHR(dev)).await,
        Err(nfsstat3::NFS3ERR_NOTSUPP)
    );
    assert!(!vol.mnt.join("null").exists());
    // READ of a FIFO is refused rather than blocking the server.
    assert_eq!(c.read(&fifo, 0, 10).await, Err(nfsstat3::NFS3ERR_INVAL));

    // Names with '/' and "."/".." in creating calls are refused.
    assert!(c.create(&root, "a/b", 0o644).await.is_err());
    assert!(c.mkdir(&root, "..", 0o755).await.is_err());
    assert!(c.create(&root, ".", 0o644).await.is_err());

    // FSSTAT is the volume's statvfs.
    let s = c.fsstat(&root).await.unwrap();
    let v = rustix::fs::statvfs(&vol.mnt).unwrap();
    assert_eq!(s.tbytes, v.f_blocks * v.f_frsize);
    assert_eq!(s.tfiles, v.f_files);
    let free = v.f_bfree * v.f_frsize;
    assert!(s.fbytes.abs_diff(free) <= 1 << 20, "{} vs {free}", s.fbytes);
    assert!(s.tbytes < 32 << 20 && s.tbytes > 16 << 20);
}

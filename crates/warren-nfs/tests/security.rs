//! What a guest must not be able to do: forge handles, reach outside its export through
//! symlinks or "..", write as someone else, or write to a read-only export; and what must keep
//! working: handles across a server restart, and the server after garbage on the wire.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;
use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::xdr_codec::Opaque;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_run_as_the_callers_ids() {
    let vol = ext4(16);
    std::fs::create_dir(vol.mnt.join("shared")).unwrap();
    std::fs::set_permissions(vol.mnt.join("shared"), PermissionsExt::from_mode(0o1777)).unwrap();
    std::fs::create_dir(vol.mnt.join("rootonly")).unwrap();
    std::fs::set_permissions(vol.mnt.join("rootonly"), PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(vol.mnt.join("rootonly/f"), b"root's").unwrap();
    std::fs::set_permissions(vol.mnt.join("rootonly/f"), PermissionsExt::from_mode(0o644)).unwrap();
    let srv = start(vec![export("/v0", &vol.mnt, false)], KEY).await;
    let mut a = mount(srv.addr, "/v0", Some((1000, 1000, vec![1000, 27]))).await;
    let mut b = mount(srv.addr, "/v0", Some((2000, 2001, vec![]))).await;
    let mut nobody = mount(srv.addr, "/v0", None).await;
    let root = a.root.clone();
    let shared = a.lookup(&root, "shared").await.unwrap();

    a.create(&shared, "a.txt", 0o644).await.unwrap();
    b.create(&shared, "b.txt", 0o600).await.unwrap();
    b.mkdir(&shared, "bdir", 0o700).await.unwrap();
    nobody.create(&shared, "n.txt", 0o644).await.unwrap();
    let ids = |n: &str| {
        let m = std::fs::symlink_metadata(vol.mnt.join("shared").join(n)).unwrap();
        (m.uid(), m.gid())
    };
    assert_eq!(ids("a.txt"), (1000, 1000));
    assert_eq!(ids("b.txt"), (2000, 2001));
    assert_eq!(ids("bdir"), (2000, 2001));
    assert_eq!(ids("n.txt"), (65534, 65534));

    // The kernel checks permissions as the caller: a's uid cannot read b's 0600 file, nor
    // write into a root-owned 0755 directory, nor remove b's file from the sticky directory.
    let bf = a.lookup(&shared, "b.txt").await.unwrap();
    assert_eq!(err(a.read(&bf, 0, 10).await), Some(nfsstat3::NFS3ERR_ACCES));
    assert_eq!(
        err(a.write(&bf, 0, b"x", stable_how::FILE_SYNC).await),
        Some(nfsstat3::NFS3ERR_ACCES)
    );
    let ro = a.lookup(&root, "rootonly").await.unwrap();
    assert_eq!(
        err(a.create(&ro, "new", 0o644).await),
        Some(nfsstat3::NFS3ERR_ACCES)
    );
    assert_eq!(
        err(a.mkdir(&ro, "newdir", 0o755).await),
        Some(nfsstat3::NFS3ERR_ACCES)
    );
    let rf = a.lookup(&ro, "f").await.unwrap();
    assert_eq!(
        err(a.write(&rf, 0, b"x", stable_how::UNSTABLE).await),
        Some(nfsstat3::NFS3ERR_ACCES)
    );
    assert_eq!(
        err(a.setattr(&rf, mode(0o777)).await),
        Some(nfsstat3::NFS3ERR_PERM)
    );
    assert_eq!(a.read(&rf, 0, 10).await.unwrap().0, b"root's");
    assert_eq!(
        err(a.remove(&shared, "b.txt").await),
        Some(nfsstat3::NFS3ERR_PERM)
    );
    assert!(!vol.mnt.join("rootonly/new").exists());
    assert_eq!(
        std::fs::read(vol.mnt.join("rootonly/f")).unwrap(),
        b"root's"
    );
    // Supplementary groups count: a group-writable file of group 27 is writable by a.
    std::fs::write(vol.mnt.join("rootonly/g27"), b"").unwrap();
    std::os::unix::fs::chown(vol.mnt.join("rootonly/g27"), Some(0), Some(27)).unwrap();
    std::fs::set_permissions(
        vol.mnt.join("rootonly/g27"),
        PermissionsExt::from_mode(0o664),
    )
    .unwrap();
    let g = a.lookup(&ro, "g27").await.unwrap();
    a.write(&g, 0, b"group", stable_how::FILE_SYNC)
        .await
        .unwrap();
    assert_eq!(
        err(b.write(&g, 0, b"other", stable_how::FILE_SYNC).await),
        Some(nfsstat3::NFS3ERR_ACCES)
    );
    // The guest's root is root inside the export.
    let mut r = mount(srv.addr, "/v0", Some((0, 0, vec![]))).await;
    r.create(&ro, "byroot", 0o600).await.unwrap();
    assert_eq!(r.read(&bf, 0, 10).await.unwrap().0, b"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_survive_a_restart_and_cannot_be_forged() {
    let vol = ext4(16);
    let exports = || vec![export("/v0", &vol.mnt, false)];
    let srv = start(exports(), KEY).await;
    let mut c = mount(srv.addr, "/v0", Some((0, 0, vec![]))).await;
    let root = c.root.clone();
    let d = c.mkdir(&root, "d", 0o755).await.unwrap();
    let f = c.create(&d, "f", 0o644).await.unwrap();
    c.write(&f, 0, b"kept", stable_how::FILE_SYNC)
        .await
        .unwrap();
    srv.stop().await;
    drop(c);

    // A new server process (same key) honours the old handles, with a new write verifier.
    let srv = start(exports(), KEY).await;
    let mut c = mount(srv.addr, "/v0", Some((0, 0, vec![]))).await;
    assert_eq!(c.root, root);
    assert_eq!(c.read(&f, 0, 100).await.unwrap().0, b"kept");
    assert_eq!(c.getattr(&d).await.unwrap().type_, ftype3::NF3DIR);
    let w = c.write(&f, 4, b"!", stable_how::UNSTABLE).await.unwrap();
    let ws = c.write(&f, 5, b"!", stable_how::UNSTABLE).await.unwrap();
    assert_eq!(w.verf, ws.verf);

    // Any flipped byte, a truncation, or an extension: BADHANDLE.
    for i in 0..f.data.len() {
        let mut bad = f.data.to_vec();
        bad[i] ^= 0x01;
        let bad = nfs_fh3 {
            data: Opaque::owned(bad),
        };
        assert_eq!(
            err(c.getattr(&bad).await),
            Some(nfsstat3::NFS3ERR_BADHANDLE),
            "byte {i}"
        );
    }
    for bad in [
        f.data[..f.data.len() - 1].to_vec(),
        [f.data.to_vec(), vec![0]].concat(),
        vec![],
        vec![1; 64],
    ] {
        let bad = nfs_fh3 {
            data: Opaque::owned(bad),
        };
        assert_eq!(
            err(c.getattr(&bad).await),
            Some(nfsstat3::NFS3ERR_BADHANDLE)
        );
        assert_eq!(
            err(c.read(&bad, 0, 1).await),
            Some(nfsstat3::NFS3ERR_BADHANDLE)
        );
    }
    srv.stop().await;

    // A server under another key refuses them all.
    let srv = start(exports(), [0x11; 32]).await;
    let mut c = mount(srv.addr, "/v0", Some((0, 0, vec![]))).await;
    assert_ne!(c.root, root);
    for h in [&root, &d, &f] {
        assert_eq!(err(c.getattr(h).await), Some(nfsstat3::NFS3ERR_BADHANDLE));
    }
    // A removed file's handle is stale.
    let f2 = c.lookup(&c.root.clone(), "d").await.unwrap();
    let g = c.create(&f2, "g", 0o644).await.unwrap();
    c.remove(&f2, "g").await.unwrap();
    assert_eq!(err(c.getattr(&g).await), Some(nfsstat3::NFS3ERR_STALE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_symlinks_are_never_followed() {
    let vol = ext4(16);
    let outside = vol.tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"outside").unwrap();
    let sub = vol.mnt.join("a/b");
    std::fs::create_dir_all(&sub).unwrap();
    std::os::unix::fs::symlink("/etc", vol.mnt.join("etc")).unwrap();
    std::os::unix::fs::symlink("../../..", sub.join("up")).unwrap();
    std::os::unix::fs::symlink(&outside, vol.mnt.join("out")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), vol.mnt.join("sec")).unwrap();
    std::os::unix::fs::symlink(outside.join("new"), vol.mnt.join("dangling")).unwrap();
    let etc_before: Vec<_> = std::fs::read_dir("/etc")
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();

    let srv = start(vec![export("/v0", &vol.mnt, false)], KEY).await;
    let mut c = mount(srv.addr, "/v0", Some((0, 0, vec![]))).await;
    let root = c.root.clone();
    let a = c.lookup(&root, "a").await.unwrap();
    let b = c.lookup(&a, "b").await.unwrap();

    for (dir, n) in [(&root, "etc"), (&b, "up"), (&root, "out"), (&root, "sec")] {
        let l = c.lookup(dir, n).await.unwrap();
        assert_eq!(c.getattr(&l).await.unwrap().type_, ftype3::NF3LNK, "{n}");
        assert!(!c.readlink(&l).await.unwrap().is_empty());
        // Nothing is looked up, read, created or listed through the link.
        assert!(c.lookup(&l, "passwd").await.is_err(), "{n}");
        assert!(c.lookup(&l, "secret").await.is_err(), "{n}");
        assert!(c.read(&l, 0, 100).await.is_err(), "{n}");
        assert!(
            c.create(&l, "planted-by-guest", 0o644).await.is_err(),
            "{n}"
        );
        assert!(c.mkdir(&l, "planted-dir", 0o755).await.is_err(), "{n}");
        assert!(c.readdir(&l).await.is_err(), "{n}");
        assert!(
            c.write(&l, 0, b"pwned", stable_how::FILE_SYNC)
                .await
                .is_err(),
            "{n}"
        );
        let trunc = sattr3 {
            size: set_size3::Some(0),
            ..Default::default()
        };
        assert!(c.setattr(&l, trunc).await.is_err(), "{n}");
    }
    // Creating over a planted link's name does not create its target.
    assert!(c.create(&root, "dangling", 0o644).await.is_err());
    assert!(c
        .create_how(&root, "dangling", createhow3::GUARDED(mode(0o644)))
        .await
        .is_err());
    assert!(c.mkdir(&root, "dangling", 0o755).await.is_err());
    assert!(!outside.join("new").exists());
    // Names with a slash never reach a path walk.
    assert!(c.lookup(&root, "out/secret").await.is_err());
    assert!(c.lookup(&b, "up/etc").await.is_err());
    assert!(c.create(&root, "out/planted", 0o644).await.is_err());
    // ".." at the root is the root, however often.
    let mut h = b.clone();
    for _ in 0..5 {
        h = c.lookup(&h, "..").await.unwrap();
    }
    assert_eq!(h, root);
    let plus = c.readdirplus(&root).await.unwrap();
    assert!(plus.iter().any(|(n, _)| n == ".."));
    let root_id = c.getattr(&root).await.unwrap().fileid;
    let dotdot =
        c.c.readdir(&READDIR3args {
            dir: root.clone(),
            cookie: 0,
            cookieverf: cookieverf3::default(),
            count: 4096,
        })
        .await
        .unwrap()
        .unwrap();
    let dd = dotdot
        .reply
        .entries
        .0
        .iter()
        .find(|e| e.name.0.as_ref() == b"..");
    assert_eq!(dd.unwrap().fileid, root_id);

    // The outside is untouched.
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"outside");
    let names: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["secret"]);
    let etc_after: Vec<_> = std::fs::read_dir("/etc")
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(etc_before, etc_after);
    assert!(!std::path::Path::new("/etc/planted-by-guest").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subdirectory_export_stays_inside() {
    let vol = ext4(16);
    std::fs::create_dir_all(vol.mnt.join("sub/inner")).unwrap();
    std::fs::create_dir_all(vol.mnt.join("other")).unwrap();
    std::fs::write(vol.mnt.join("other/private"), b"other's").unwrap();
    let srv = start(
        vec![
            export("/sub", &vol.mnt.join("sub"), false),
            export("/whole", &vol.mnt, false),
        ],
        KEY,
    )
    .await;
    let mut c = mount(srv.addr, "/sub", Some((0, 0, vec![]))).await;
    let root = c.root.clone();
    assert_eq!(c.lookup(&root, "..").await.unwrap(), root);
    let inner = c.lookup(&root, "inner").await.unwrap();
    assert_eq!(c.lookup(&inner, "..").await.unwrap(), root);
    assert_eq!(c.readdir(&root).await.unwrap(), vec![".", "..", "inner"]);

    // A directory moved out of the export (by someone with the whole volume) is gone for it.
    std::fs::rename(vol.mnt.join("sub/inner"), vol.mnt.join("other/inner")).unwrap();
    assert_eq!(err(c.getattr(&inner).await), Some(nfsstat3::NFS3ERR_STALE));
    assert!(c.create(&inner, "x", 0o644).await.is_err());
    assert!(!vol.mnt.join("other/inner/x").exists());

    // A handle of the whole volume cannot be passed off as the subdirectory export's: its
    // export tag rewritten, the MAC fails. (Every export of one server is open to its clients
    // through MNT; the integration runs one server per VM with only that VM's volumes.)
    let mut w = mount(srv.addr, "/whole", Some((0, 0, vec![]))).await;
    let other = w.lookup(&w.root.clone(), "other").await.unwrap();
    let mut forged = other.data.to_vec();
    forged[1..5].copy_from_slice(&root.data[1..5]);
    let forged = nfs_fh3 {
        data: Opaque::owned(forged),
    };
    assert_eq!(
        err(c.getattr(&forged).await),
        Some(nfsstat3::NFS3ERR_BADHANDLE)
    );
    assert_eq!(
        err(c.readdir(&forged).await),
        Some(nfsstat3::NFS3ERR_BADHANDLE)
    );
    // Renames and links across exports are refused.
    let sf = c.create(&root, "f", 0o644).await.unwrap();
    assert_eq!(
        err(c.rename(&root, "f", &other, "x").await),
        Some(nfsstat3::NFS3ERR_XDEV)
    );
    assert_eq!(
        err(c.link(&sf, &other, "x").await),
        Some(nfsstat3::NFS3ERR_XDEV)
    );
    assert!(!vol.mnt.join("other/x").exists());
    // LINK of a planted symlink to a file outside the subdirectory (same filesystem) makes,
    // at most, another symlink: never a hard link to the outside file.
    std::os::unix::fs::symlink("../other/private", vol.mnt.join("sub/tofile")).unwrap();
    let l = c.lookup(&root, "tofile").await.unwrap();
    if c.link(&l, &root, "grab").await.is_ok() {
        let m = std::fs::symlink_metadata(vol.mnt.join("sub/grab")).unwrap();
        assert!(m.file_type().is_symlink());
    }
    assert_eq!(
        std::fs::metadata(vol.mnt.join("other/private"))
            .unwrap()
            .nlink(),
        1
    );
    assert!(c.read(&l, 0, 10).await.is_err());
    // Unknown export paths do not mount.
    assert!(try_mount(srv.addr, "/", None).await.is_err());
    assert!(try_mount(srv.addr, "/sub/inner", None).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_export_refuses_every_change() {
    let vol = ext4(16);
    std::fs::create_dir(vol.mnt.join("d")).unwrap();
    std::fs::write(vol.mnt.join("f"), b"content").unwrap();
    let srv = start(vec![export("/ro", &vol.mnt, true)], KEY).await;
    let mut c = mount(srv.addr, "/ro", Some((0, 0, vec![]))).await;
    let root = c.root.clone();
    let f = c.lookup(&root, "f").await.unwrap();
    let d = c.lookup(&root, "d").await.unwrap();
    let rofs = Some(nfsstat3::NFS3ERR_ROFS);
    assert_eq!(c.read(&f, 0, 100).await.unwrap().0, b"content");
    assert_eq!(err(c.write(&f, 0, b"x", stable_how::FILE_SYNC).await), rofs);
    assert_eq!(err(c.setattr(&f, mode(0o777)).await), rofs);
    assert_eq!(err(c.create(&root, "n", 0o644).await), rofs);
    assert_eq!(err(c.mkdir(&root, "n", 0o755).await), rofs);
    assert_eq!(err(c.symlink(&root, "n", "x").await), rofs);
    assert_eq!(
        err(c.mknod(&root, "n", mknoddata3::NF3FIFO(mode(0o644))).await),
        rofs
    );
    assert_eq!(err(c.remove(&root, "f").await), rofs);
    assert_eq!(err(c.rmdir(&root, "d").await), rofs);
    assert_eq!(err(c.rename(&root, "f", &d, "g").await), rofs);
    assert_eq!(err(c.link(&f, &d, "g").await), rofs);
    let acc =
        c.c.access(&ACCESS3args {
            object: f.clone(),
            access: ACCESS3_READ | ACCESS3_MODIFY | ACCESS3_EXTEND,
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(acc.access, ACCESS3_READ);
    assert_eq!(std::fs::read(vol.mnt.join("f")).unwrap(), b"content");
    assert_eq!(c.readdir(&root).await.unwrap(), vec![".", "..", "d", "f"]);
}

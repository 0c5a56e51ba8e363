//! Test harness: real loop-mounted ext4 volumes, a server on loopback, and a thin wrapper
//! over `nfs3_client` that turns NFS results into `Result<_, nfsstat3>`. These tests need root
//! and loop devices; without them they fail with the reason.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::tokio::{TokioConnector, TokioIo};
use nfs3_client::Nfs3ConnectionBuilder;
use tokio::net::TcpStream;
use warren_nfs::{Export, Server};

pub const KEY: [u8; 32] = [0x5a; 32];

/// A loop-mounted ext4 filesystem (nosuid,nodev, as the host mounts volumes) in a temp dir.
pub struct Vol {
    pub tmp: tempfile::TempDir,
    pub mnt: PathBuf,
}

pub fn ext4(mib: u64) -> Vol {
    assert!(
        rustix::process::geteuid().is_root(),
        "warren-nfs's tests mount filesystems and serve as root; run them as root"
    );
    assert!(
        Path::new("/dev/loop-control").exists(),
        "warren-nfs's tests need loop devices (/dev/loop-control is missing)"
    );
    let tmp = tempfile::Builder::new()
        .prefix("warren-nfs-test-")
        .tempdir()
        .unwrap();
    let img = tmp.path().join("vol.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(mib << 20).unwrap();
    drop(f);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("mount")
        .args(["-o", "loop,nosuid,nodev"])
        .arg(&img)
        .arg(&mnt));
    // mkfs leaves lost+found; the tests expect an empty root.
    std::fs::remove_dir(mnt.join("lost+found")).unwrap();
    Vol { tmp, mnt }
}

fn run(c: &mut Command) {
    let out = c.output().unwrap_or_else(|e| panic!("running {c:?}: {e}"));
    assert!(
        out.status.success(),
        "{c:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for Vol {
    fn drop(&mut self) {
        // A server just stopped may still be closing its descriptors: retry a little.
        for _ in 0..40 {
            let ok = Command::new("umount")
                .arg(&self.mnt)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let still = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .contains(self.mnt.to_str().unwrap());
        if still {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

pub fn export(path: &str, root: &Path, read_only: bool) -> Export {
    Export {
        path: path.into(),
        root: root.into(),
        read_only,
    }
}

/// A server on a loopback port, stopped when dropped.
pub struct Running {
    pub addr: SocketAddr,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Running {
    pub async fn stop(mut self) {
        let t = self.task.take().unwrap();
        t.abort();
        let _ = t.await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

pub async fn start(exports: Vec<Export>, key: [u8; 32]) -> Running {
    let server = Server::new(exports, key).expect("starting the server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = Some(tokio::spawn(server.serve(listener)));
    Running { addr, task }
}

pub type Conn = nfs3_client::Nfs3Connection<TokioIo<TcpStream>>;

/// A client mounted on `path` as uid/gid (with `gids`), or AUTH_NONE if `uid` is None.
pub struct Client {
    pub c: Conn,
    pub root: nfs_fh3,
}

pub async fn mount(addr: SocketAddr, path: &str, uid: Option<(u32, u32, Vec<u32>)>) -> Client {
    try_mount(addr, path, uid).await.expect("mounting")
}

pub async fn try_mount(
    addr: SocketAddr,
    path: &str,
    uid: Option<(u32, u32, Vec<u32>)>,
) -> Result<Client, nfs3_client::ConnectError> {
    let mut b = Nfs3ConnectionBuilder::new(TokioConnector, addr.ip().to_string(), path)
        .portmapper_port(addr.port())
        .connect_from_privileged_port(false);
    if let Some((uid, gid, gids)) = uid {
        b = b.credential(opaque_auth::auth_unix(&auth_unix {
            stamp: 1,
            machinename: Opaque::owned(b"guest".to_vec()),
            uid,
            gid,
            gids,
        }));
    }
    let c = b.mount().await?;
    let root = c.root_nfs_fh3();
    Ok(Client { c, root })
}

pub fn name(s: &str) -> filename3<'static> {
    filename3(Opaque::owned(s.as_bytes().to_vec()))
}

pub fn dirop(dir: &nfs_fh3, n: &str) -> diropargs3<'static> {
    diropargs3 {
        dir: dir.clone(),
        name: name(n),
    }
}

pub fn mode(m: u32) -> sattr3 {
    sattr3 {
        mode: set_mode3::Some(m),
        ..Default::default()
    }
}

type R<T> = Result<T, nfsstat3>;

fn st<T, E>(r: Nfs3Result<T, E>) -> R<T> {
    match r {
        Nfs3Result::Ok(v) => Ok(v),
        Nfs3Result::Err((s, _)) => Err(s),
    }
}

/// The status of a result, for comparisons.
pub fn err<T>(r: R<T>) -> Option<nfsstat3> {
    r.err()
}

impl Client {
    pub async fn getattr(&mut self, fh: &nfs_fh3) -> R<fattr3> {
        let r = self.c.getattr(&GETATTR3args { object: fh.clone() }).await;
        st(r.unwrap()).map(|o| o.obj_attributes)
    }

    pub async fn lookup(&mut self, dir: &nfs_fh3, n: &str) -> R<nfs_fh3> {
        let r = self
            .c
            .lookup(&LOOKUP3args {
                what: dirop(dir, n),
            })
            .await;
        st(r.unwrap()).map(|o| o.object)
    }

    pub async fn create_how(&mut self, dir: &nfs_fh3, n: &str, how: createhow3) -> R<nfs_fh3> {
        let r = self
            .c
            .create(&CREATE3args {
                where_: dirop(dir, n),
                how,
            })
            .await;
        st(r.unwrap()).map(|o| o.obj.unwrap())
    }

    pub async fn create(&mut self, dir: &nfs_fh3, n: &str, m: u32) -> R<nfs_fh3> {
        self.create_how(dir, n, createhow3::UNCHECKED(mode(m)))
            .await
    }

    pub async fn mkdir(&mut self, dir: &nfs_fh3, n: &str, m: u32) -> R<nfs_fh3> {
        let r = self
            .c
            .mkdir(&MKDIR3args {
                where_: dirop(dir, n),
                attributes: mode(m),
            })
            .await;
        st(r.unwrap()).map(|o| o.obj.unwrap())
    }

    pub async fn write(
        &mut self,
        fh: &nfs_fh3,
        offset: u64,
        data: &[u8],
        stable: stable_how,
    ) -> R<WRITE3resok> {
        let r = self
            .c
            .write(&WRITE3args {
                file: fh.clone(),
                offset,
                count: data.len() as u32,
                stable,
                data: Opaque::borrowed(data),
            })
            .await;
        st(r.unwrap())
    }

    pub async fn read(&mut self, fh: &nfs_fh3, offset: u64, count: u32) -> R<(Vec<u8>, bool)> {
        let r = self
            .c
            .read(&READ3args {
                file: fh.clone(),
                offset,
                count,
            })
            .await;
        st(r.unwrap()).map(|o| (o.data.to_vec(), o.eof))
    }

    pub async fn commit(&mut self, fh: &nfs_fh3) -> R<writeverf3> {
        let r = self
            .c
            .commit(&COMMIT3args {
                file: fh.clone(),
                offset: 0,
                count: 0,
            })
            .await;
        st(r.unwrap()).map(|o| o.verf)
    }

    pub async fn setattr(&mut self, fh: &nfs_fh3, s: sattr3) -> R<()> {
        let r = self
            .c
            .setattr(&SETATTR3args {
                object: fh.clone(),
                new_attributes: s,
                guard: sattrguard3::None,
            })
            .await;
        st(r.unwrap()).map(|_| ())
    }

    pub async fn remove(&mut self, dir: &nfs_fh3, n: &str) -> R<()> {
        let r = self
            .c
            .remove(&REMOVE3args {
                object: dirop(dir, n),
            })
            .await;
        st(r.unwrap()).map(|_| ())
    }

    pub async fn rmdir(&mut self, dir: &nfs_fh3, n: &str) -> R<()> {
        let r = self
            .c
            .rmdir(&RMDIR3args {
                object: dirop(dir, n),
            })
            .await;
        st(r.unwrap()).map(|_| ())
    }

    pub async fn rename(&mut self, d1: &nfs_fh3, n1: &str, d2: &nfs_fh3, n2: &str) -> R<()> {
        let r = self
            .c
            .rename(&RENAME3args {
                from: dirop(d1, n1),
                to: dirop(d2, n2),
            })
            .await;
        st(r.unwrap()).map(|_| ())
    }

    pub async fn symlink(&mut self, dir: &nfs_fh3, n: &str, target: &str) -> R<nfs_fh3> {
        let r = self
            .c
            .symlink(&SYMLINK3args {
                where_: dirop(dir, n),
                symlink: symlinkdata3 {
                    symlink_attributes: sattr3::default(),
                    symlink_data: nfspath3(Opaque::owned(target.as_bytes().to_vec())),
                },
            })
            .await;
        st(r.unwrap()).map(|o| o.obj.unwrap())
    }

    pub async fn readlink(&mut self, fh: &nfs_fh3) -> R<Vec<u8>> {
        let r = self
            .c
            .readlink(&READLINK3args {
                symlink: fh.clone(),
            })
            .await;
        st(r.unwrap()).map(|o| o.data.0.to_vec())
    }

    pub async fn link(&mut self, fh: &nfs_fh3, dir: &nfs_fh3, n: &str) -> R<()> {
        let r = self
            .c
            .link(&LINK3args {
                file: fh.clone(),
                link: dirop(dir, n),
            })
            .await;
        st(r.unwrap()).map(|_| ())
    }

    pub async fn mknod(&mut self, dir: &nfs_fh3, n: &str, what: mknoddata3) -> R<nfs_fh3> {
        let r = self
            .c
            .mknod(&MKNOD3args {
                where_: dirop(dir, n),
                what,
            })
            .await;
        st(r.unwrap()).map(|o| o.obj.unwrap())
    }

    /// All names in a directory (READDIR, small pages to exercise cookies).
    pub async fn readdir(&mut self, dir: &nfs_fh3) -> R<Vec<String>> {
        let mut names = Vec::new();
        let mut cookie = 0;
        loop {
            let r = self
                .c
                .readdir(&READDIR3args {
                    dir: dir.clone(),
                    cookie,
                    cookieverf: cookieverf3::default(),
                    count: 300,
                })
                .await;
            let ok = st(r.unwrap())?;
            for e in ok.reply.entries.0 {
                names.push(String::from_utf8(e.name.0.to_vec()).unwrap());
                cookie = e.cookie;
            }
            if ok.reply.eof {
                break;
            }
        }
        names.sort();
        Ok(names)
    }

    /// All names, with handles, of a directory (READDIRPLUS).
    pub async fn readdirplus(&mut self, dir: &nfs_fh3) -> R<Vec<(String, Option<nfs_fh3>)>> {
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let r = self
                .c
                .readdirplus(&READDIRPLUS3args {
                    dir: dir.clone(),
                    cookie,
                    cookieverf: cookieverf3::default(),
                    dircount: 200,
                    maxcount: 2000,
                })
                .await;
            let ok = st(r.unwrap())?;
            for e in ok.reply.entries.0 {
                let fh = match e.name_handle {
                    post_op_fh3::Some(f) => Some(f),
                    post_op_fh3::None => None,
                };
                out.push((String::from_utf8(e.name.0.to_vec()).unwrap(), fh));
                cookie = e.cookie;
            }
            if ok.reply.eof {
                break;
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    pub async fn fsstat(&mut self, fh: &nfs_fh3) -> R<FSSTAT3resok> {
        let r = self.c.fsstat(&FSSTAT3args { fsroot: fh.clone() }).await;
        st(r.unwrap())
    }
}

/// A cheap checksum for comparing large buffers in assertion messages.
pub fn sum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

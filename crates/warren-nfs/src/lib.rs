//! A userspace NFSv3 server that serves volume directories to microVM guests.
//!
//! One TCP port carries NFS v3 (program 100003), MOUNT v3 (100005: NULL, MNT, DUMP, UMNT,
//! UMNTALL, EXPORT) and PORTMAP v2 (100000: NULL, GETPORT, DUMP; GETPORT answers this port for
//! both programs), so a Linux guest mounts with
//! `vers=3,proto=tcp,port=N,mountport=N,mountproto=tcp,nolock` and needs no rpcbind. All 21
//! NFSv3 procedures are served; MKNOD makes FIFOs and sockets and refuses device nodes.
//!
//! # File handles
//!
//! A handle is the kernel's own handle for the object (`name_to_handle_at`: for ext4 the inode
//! number and generation), the export's tag (a hash of its MOUNT path) and a 16-byte
//! HMAC-SHA256 under the server's 32-byte key over both (and the export's path). Handles are
//! resolved with `open_by_handle_at` on the export's root, so they name the same objects after
//! the server restarts (with the same key) and after a VM snapshot is restored, and they cannot
//! be forged: a handle that fails the MAC is `NFS3ERR_BADHANDLE`; one whose object is gone
//! (deleted, or an inode reused with a new generation) is `NFS3ERR_STALE`.
//!
//! # Confinement
//!
//! A handle resolves only on its export's filesystem (the root's descriptor is the mount
//! argument of `open_by_handle_at`, and the device is checked). When the export is a
//! subdirectory rather than a filesystem's root, a directory's handle is also checked to be
//! beneath the root by walking "..". (A non-directory handed out earlier and since moved out of
//! a subdirectory export by someone else, with access outside the export, still resolves, as
//! with knfsd's `no_subtree_check`; nothing a guest does through this server can move one out.)
//! Names are looked up one component at a time with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS)`: a symlink is returned as
//! itself (READLINK gives its text, the guest resolves it), never followed by the server;
//! ".." at the export's root is the root. Names with '/' or NUL are refused, and "." and ".."
//! in creating, removing and renaming calls. Everything else works on descriptors
//! (`mkdirat`, `renameat`, `linkat` and the like on directories already inside). Read-only
//! exports answer `NFS3ERR_ROFS` to every modifying call. LINK and RENAME across exports are
//! `NFS3ERR_XDEV`. MOUNT has no access control of its own: every export of a server is open
//! to whoever reaches its port, so a server (one per VM) carries only that VM's volumes.
//!
//! # Identity
//!
//! Each call runs on a blocking thread that first resolves the handles as root, then takes on
//! the caller's AUTH_UNIX uid, gid and supplementary groups (per-thread `setfsuid`,
//! `setfsgid` and the raw `setgroups` syscall), so every permission check is the kernel's and
//! new files belong to the caller; the ids are restored afterwards (or the process aborts).
//! Data is opened through the object's `/proc/self/fd` link under the caller's ids, so an
//! open is checked as any open would be. A guest's uid 0 is root inside the export (no root
//! squash: the host mounts volumes nosuid,nodev); AUTH_NONE callers are nobody (65534).
//!
//! # Limits
//!
//! Records are at most 1 MiB plus 16 KiB; READ and WRITE at most 1 MiB (rtmax, wtmax);
//! malformed calls get GARBAGE_ARGS (or an auth error), an oversized record closes the
//! connection. Every length a call declares (credentials, handles, names, data) is checked
//! against the record and its limit before `nfs3_types` decodes (and allocates for) it. WRITEs with FILE_SYNC or DATA_SYNC are synced before the reply; COMMIT fsyncs;
//! the write verifier is random per server process, so clients resend uncommitted UNSTABLE
//! writes after a restart. FSSTAT reports the export's filesystem's `statvfs`.
//!
//! The server must run as root (CAP_SETUID/CAP_SETGID for the ids, CAP_DAC_READ_SEARCH in the
//! initial user namespace for `open_by_handle_at`), with /proc mounted.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

mod creds;
mod dirops;
mod fs;
mod guard;
mod handle;
mod mount;
mod nfs;
mod readdir;
mod rpc;
mod server;

/// A directory served to guests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// The path a client mounts, like `/v0`.
    pub path: String,
    /// The host directory served: a volume's root (its own filesystem) or a directory in it.
    pub root: PathBuf,
    /// Refuse every modifying call with NFS3ERR_ROFS.
    pub read_only: bool,
}

/// An NFSv3 server for a set of exports.
pub struct Server {
    ctx: Arc<fs::Ctx>,
}

impl Server {
    /// Opens the exports. `key` seals the file handles: keep it across restarts (and for a
    /// VM's restored snapshot) so the handles a guest holds stay valid, and secret so a guest
    /// cannot forge one. Fails if not root, or if an export cannot be opened.
    pub fn new(exports: Vec<Export>, key: [u8; 32]) -> io::Result<Server> {
        Ok(Server {
            ctx: Arc::new(fs::Ctx::new(exports, key)?),
        })
    }

    /// Serves NFS, MOUNT and PORTMAP on `listener` until the future is dropped (or accepting
    /// fails for good; a failed connection only ends that connection).
    pub async fn serve(self, listener: tokio::net::TcpListener) -> io::Result<()> {
        server::serve(self.ctx, listener).await
    }
}

/// Serves `exports` on `listen` from a runtime of its own, forever: the entry point for a
/// helper process (one per VM, inside its network namespace).
pub fn run(listen: SocketAddr, exports: Vec<Export>, key: [u8; 32]) -> io::Result<()> {
    let server = Server::new(exports, key)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        server.serve(listener).await
    })
}

//! A VM's volumes, served to its guest over NFSv3 by a helper process (`warren-nfsd`, from
//! the `warren-nfs` crate) of its own.
//!
//! The helper listens on the guest's gateway address ([`warren_net::SANDBOX_GATEWAY`],
//! port [`warren_net::NFS_PORT`]) inside the VM's slot: an address only that guest reaches,
//! the same in every slot, so a VM restored in another slot finds its server where its
//! mounts left it. The runtime makes the listening socket itself (in the slot's namespace)
//! and hands it to the helper as standard input, so the listener exists before the VM is
//! restored: a guest waking up with mounts (a resume, a snapshot's child) never meets a
//! closed port. The helper joins the VM's cgroup, so everything that kills a VM's cgroup
//! (kill, teardown, a later server's cleanup of stale VMs) ends it too, and it outlives a
//! server restart exactly as QEMU does. Its file handles are sealed with one key per data
//! directory ([`key_file`]), so they stay valid across helpers: a restored guest's open
//! files keep working.

use std::io::Write;

use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

use sha2::{Digest, Sha256};
use warren_host::agent::InitVolumeMount;
use warren_host::cgroup::SandboxCgroup;
use warren_runtime::{RuntimeError, VolumeMount};

/// How long a helper may take to open its exports.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Where the guest reaches its NFS server.
pub fn server_addr() -> SocketAddrV4 {
    SocketAddrV4::new(warren_net::SANDBOX_GATEWAY, warren_net::NFS_PORT)
}

/// The path the guest mounts volume mount `i` by. It names the volume, the subpath and the
/// mode (not only the position), so an agent restored from another sandbox's memory, which
/// already holds mounts, can tell whether a mount it is asked for is the one it has.
pub fn export_path(i: usize, v: &VolumeMount) -> String {
    let mut h = Sha256::new();
    h.update(v.volume_id.as_bytes());
    h.update([0]);
    h.update(v.subpath.as_deref().unwrap_or("").as_bytes());
    h.update([0, u8::from(v.read_only)]);
    let digest = format!("{:x}", h.finalize());
    format!("/v{i}-{}", &digest[..16])
}

/// What the agent's `/init` is told to mount (E2B's `volumeMounts`: `nfs_target`, `path`).
pub fn agent_mounts(volumes: &[VolumeMount]) -> Vec<InitVolumeMount> {
    volumes
        .iter()
        .enumerate()
        .map(|(i, v)| InitVolumeMount {
            nfs_target: format!("{}:{}", warren_net::SANDBOX_GATEWAY, export_path(i, v)),
            path: v.path.clone(),
            read_only: v.read_only,
            port: warren_net::NFS_PORT,
        })
        .collect()
}

/// The key that seals every helper's file handles: `<data_dir>/nfs.key` (32 random bytes,
/// root's, mode 0600), made on first use and kept.
pub fn key_file(data_dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join("nfs.key");
    match std::fs::metadata(&path) {
        Ok(m) if m.len() == 32 => return Ok(path),
        Ok(m) => {
            return Err(std::io::Error::other(format!(
                "{} has {} bytes, not 32: remove it only if no VM with volumes exists",
                path.display(),
                m.len()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))?;
    // Unique per call, not only per process: runtimes started side by side in one process
    // (tests do) would otherwise remove or clobber each other's file before it is linked.
    static MAKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MAKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = data_dir.join(format!("nfs.key.{}.{n}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&key)?;
    f.sync_all()?;
    // A racing maker's key wins if it was first: link fails, ours is dropped.
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Ok(d) = std::fs::File::open(data_dir) {
                let _ = d.sync_all();
            }
            Ok(path)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(path),
        Err(e) => Err(e),
    }
}

/// The helper's arguments for `volumes`.
fn args(key: &Path, volumes: &[VolumeMount]) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = vec!["--key-file".into(), key.into()];
    for (i, v) in volumes.iter().enumerate() {
        a.push("--export".into());
        a.push(export_path(i, v).into());
        a.push(v.source.clone().into());
        a.push(v.subpath.clone().unwrap_or_default().into());
        a.push(if v.read_only { "ro" } else { "rw" }.into());
    }
    a
}

/// File in a VM's directory recording the volumes its helper serves, so that a later
/// server can start the helper again if it is gone (see [`ensure_running`]).
const VOLUMES_FILE: &str = "nfs-volumes.json";

/// Records `volumes` as what the VM in `dir` mounts.
pub fn record(dir: &Path, volumes: &[VolumeMount]) -> std::io::Result<()> {
    let json = serde_json::to_vec(volumes).map_err(std::io::Error::other)?;
    std::fs::write(dir.join(VOLUMES_FILE), json)
}

/// The `warren-nfsd` processes in `cgroup`.
fn running(cgroup: &SandboxCgroup) -> Vec<u32> {
    cgroup
        .pids()
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "warren-nfsd")
        })
        .collect()
}

/// For a VM taken back after a restart: starts its helper again if the VM has volumes and
/// no helper runs in its cgroup (it ended while the server was down). `Ok(false)`: nothing
/// to do.
pub async fn ensure_running(h: &Helper<'_>) -> Result<bool, RuntimeError> {
    let Ok(raw) = std::fs::read(h.dir.join(VOLUMES_FILE)) else {
        return Ok(false);
    };
    let volumes: Vec<VolumeMount> = serde_json::from_slice(&raw).map_err(super::failed)?;
    if volumes.is_empty() || !running(h.cgroup).is_empty() {
        return Ok(false);
    }
    start(h, &volumes).await.map(|_| true)
}

/// What starting a VM's helper needs.
pub struct Helper<'a> {
    pub bin: &'a Path,
    pub key: &'a Path,
    /// The slot's network namespace (laid out for a VM: the gateway address exists).
    pub netns: &'a Path,
    /// The VM's directory: the helper's log goes to `nfs.log` there.
    pub dir: &'a Path,
    pub cgroup: &'a SandboxCgroup,
}

/// Starts the helper serving `volumes` and returns once it serves them (its listener exists
/// from the start; this waits until every export is open). On failure nothing is left
/// running.
pub async fn start(h: &Helper<'_>, volumes: &[VolumeMount]) -> Result<u32, RuntimeError> {
    if !h.bin.exists() {
        return Err(RuntimeError::unavailable_now(format!(
            "{} is missing (build the workspace: cargo build --release)",
            h.bin.display()
        )));
    }
    let addr = server_addr();
    let listener = warren_net::netns::run_in(h.netns, move || {
        std::net::TcpListener::bind(SocketAddr::V4(addr))
    })
    .map_err(|e| RuntimeError::unavailable("enter the slot for the NFS listener", e))?
    .map_err(RuntimeError::io(format!(
        "listen on {addr} in the VM's slot"
    )))?;
    let log_path = h.dir.join("nfs.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(RuntimeError::io(format!("open {}", log_path.display())))?;
    let mut cmd = tokio::process::Command::new(h.bin);
    cmd.args(args(h.key, volumes))
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            listener,
        )))
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .env_clear()
        // Not in the server's process group: a ^C to the server must not end it.
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(RuntimeError::io(format!("start {}", h.bin.display())))?;
    let pid = child.id().unwrap_or(0);
    let ready = async {
        h.cgroup
            .add(pid)
            .map_err(RuntimeError::io("move the NFS helper into the VM's cgroup"))?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| super::failed("no stdout"))?;
        let mut line = String::new();
        let mut out = tokio::io::BufReader::new(out);
        let read = out.read_line(&mut line);
        match tokio::time::timeout(START_TIMEOUT, read).await {
            Ok(Ok(_)) if line.trim() == "ready" => Ok(()),
            Ok(_) => Err(RuntimeError::unavailable_now(format!(
                "the NFS helper did not start: {}",
                log_tail(&log_path)
            ))),
            Err(_) => Err(RuntimeError::unavailable_now(
                "the NFS helper did not open its exports in time",
            )),
        }
    };
    match ready.await {
        // Dropped, not awaited: tokio reaps it whenever it ends (it is the VM's cgroup's).
        Ok(()) => Ok(pid),
        Err(e) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            Err(e)
        }
    }
}

/// The helper's last words, on one line.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let last: Vec<&str> = text.lines().rev().take(3).collect();
    let mut out: Vec<&str> = last.into_iter().rev().collect();
    if out.is_empty() {
        out.push("no output");
    }
    crate::qemu::escape(&out.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(id: &str, sub: Option<&str>, ro: bool) -> VolumeMount {
        VolumeMount {
            volume_id: id.into(),
            source: PathBuf::from(format!("/data/volumes/{id}/data")),
            subpath: sub.map(str::to_string),
            path: "/data".into(),
            read_only: ro,
        }
    }

    #[test]
    fn export_paths_name_the_volume_subpath_and_mode() {
        let a = export_path(0, &mount("a", None, false));
        assert!(a.starts_with("/v0-") && a.len() == 20, "{a}");
        assert_eq!(a, export_path(0, &mount("a", None, false)));
        for other in [
            export_path(1, &mount("a", None, false)),
            export_path(0, &mount("b", None, false)),
            export_path(0, &mount("a", Some("x"), false)),
            export_path(0, &mount("a", None, true)),
        ] {
            assert_ne!(a, other);
        }
    }

    #[test]
    fn agent_mounts_point_at_the_gateway() {
        let m = agent_mounts(&[mount("a", None, true)]);
        assert_eq!(m.len(), 1);
        assert_eq!(
            m[0].nfs_target,
            format!("169.254.0.22:{}", export_path(0, &mount("a", None, true)))
        );
        assert!(m[0].read_only);
        assert_eq!(m[0].path, "/data");
    }

    #[test]
    fn helper_arguments_carry_every_export_in_order() {
        let a = args(
            Path::new("/k"),
            &[mount("a", Some("s/t"), true), mount("b", None, false)],
        );
        let a: Vec<String> = a.iter().map(|s| s.to_string_lossy().into()).collect();
        assert_eq!(a[..2], ["--key-file", "/k"]);
        assert_eq!(a[2..7][2..], ["/data/volumes/a/data", "s/t", "ro"]);
        assert_eq!(a[7..][2..], ["/data/volumes/b/data", "", "rw"]);
    }

    #[test]
    fn the_key_is_made_once_and_kept() {
        let d = tempfile::tempdir().unwrap();
        let k = key_file(d.path()).unwrap();
        let first = std::fs::read(&k).unwrap();
        assert_eq!(first.len(), 32);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&k).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(key_file(d.path()).unwrap(), k);
        assert_eq!(std::fs::read(&k).unwrap(), first);
        std::fs::write(&k, b"short").unwrap();
        assert!(key_file(d.path()).is_err());
    }

    #[test]
    fn makers_racing_in_one_process_all_get_the_one_key() {
        for _ in 0..20 {
            let d = tempfile::tempdir().unwrap();
            let makers: Vec<_> = (0..8)
                .map(|_| {
                    let dir = d.path().to_path_buf();
                    std::thread::spawn(move || key_file(&dir))
                })
                .collect();
            let paths: Vec<PathBuf> = makers
                .into_iter()
                .map(|t| t.join().unwrap().expect("every maker gets the key"))
                .collect();
            assert!(paths.iter().all(|p| *p == d.path().join("nfs.key")));
            assert_eq!(std::fs::read(&paths[0]).unwrap().len(), 32);
            // No temporary file is left behind.
            assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        }
    }
}

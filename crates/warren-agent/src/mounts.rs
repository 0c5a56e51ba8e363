//! Volumes the control plane asks `/init` to mount (E2B's `volumeMounts`): in a microVM, NFSv3
//! exports of the VM's own server on the host, mounted with `mount(2)`. The agent acts only
//! when told (a namespace sandbox's volumes are mounted before the agent starts).
//!
//! Mounting is idempotent: a VM restored from memory (a resume, a snapshot's child) wakes up
//! holding its mounts, so a path that already has the mount asked for is left alone. One
//! that holds another export of the same server (a snapshot's child told to mount other
//! volumes) is detached first.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use serde::Deserialize;

/// The port of the VM's NFS server (MOUNT shares it) when a request names none.
pub const DEFAULT_PORT: u16 = 2049;

/// One mount, as `/init` receives it: `{nfs_target, path}` as E2B sends them, plus Warren's
/// `read_only` and `port`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct VolumeMount {
    /// `<IPv4 address>:<export path>`.
    pub nfs_target: String,
    /// Absolute and clean path inside the sandbox.
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub port: Option<u16>,
}

/// A checked mount, ready for `mount(2)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The `nfs_target` (what `/proc/self/mountinfo` shows as the mount's source).
    pub source: String,
    /// The server's address, to recognise its other mounts.
    pub server: Ipv4Addr,
    pub target: PathBuf,
    pub flags: MsFlags,
    /// The NFS options (the kernel resolves no names: `addr=` is required).
    pub data: String,
}

/// Checks `m` and builds its mount arguments.
pub fn plan(m: &VolumeMount) -> Result<Planned, String> {
    let clean = m.path.strip_prefix('/').is_some_and(|rest| {
        !m.path.contains('\0')
            && rest
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..")
    });
    if !clean {
        return Err(format!(
            "volume mount path {:?} must be absolute and clean, not /",
            m.path
        ));
    }
    let bad_target = || {
        format!(
            "nfs_target {:?} must be <IPv4 address>:/<export>",
            m.nfs_target
        )
    };
    let (addr, export) = m.nfs_target.split_once(':').ok_or_else(bad_target)?;
    let server: Ipv4Addr = addr.parse().map_err(|_| bad_target())?;
    if !export.starts_with('/')
        || export
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == ',')
    {
        return Err(bad_target());
    }
    let port = match m.port {
        None => DEFAULT_PORT,
        Some(0) => return Err("a volume mount's port must not be 0".into()),
        Some(p) => p,
    };
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if m.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    Ok(Planned {
        source: m.nfs_target.clone(),
        server,
        target: PathBuf::from(&m.path),
        flags,
        data: format!(
            "vers=3,proto=tcp,addr={server},port={port},mountaddr={server},mountport={port},\
             mountproto=tcp,nolock,hard"
        ),
    })
}

/// What `/proc/self/mountinfo` says is mounted on `target` (the topmost mount): its file
/// system type and source.
pub fn mounted_at(mountinfo: &str, target: &Path) -> Option<(String, String)> {
    let mut found = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        if Path::new(&unescape(point)) != target {
            continue;
        }
        let mut r = right.split(' ');
        if let (Some(fstype), Some(source)) = (r.next(), r.next()) {
            found = Some((fstype.to_string(), unescape(source)));
        }
    }
    found
}

/// mountinfo's octal escapes (`\040` for a space and the like).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let (b'\\', Some(d)) = (b[i], octal) {
            let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mounts every planned volume in order (a later path may lie inside an earlier one),
/// skipping those already mounted. Blocking: NFS mounts talk to the server.
pub fn apply(planned: &[Planned]) -> Result<(), String> {
    for p in planned {
        let info = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
        match mounted_at(&info, &p.target) {
            Some((fstype, source)) if fstype.starts_with("nfs") && source == p.source => continue,
            Some((fstype, source))
                if fstype.starts_with("nfs") && source.starts_with(&format!("{}:", p.server)) =>
            {
                // Another export of this server: a restored VM's mount of another volume.
                nix::mount::umount2(&p.target, MntFlags::MNT_DETACH)
                    .map_err(|e| format!("unmount {source} from {}: {e}", p.target.display()))?;
            }
            _ => {}
        }
        std::fs::create_dir_all(&p.target)
            .map_err(|e| format!("create mount point {}: {e}", p.target.display()))?;
        nix::mount::mount(
            Some(p.source.as_str()),
            &p.target,
            Some("nfs"),
            p.flags,
            Some(p.data.as_str()),
        )
        .map_err(|e| format!("mount {} on {}: {e}", p.source, p.target.display()))?;
        tracing::info!(source = %p.source, path = %p.target.display(), "volume mounted");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(target: &str, path: &str) -> VolumeMount {
        VolumeMount {
            nfs_target: target.into(),
            path: path.into(),
            read_only: false,
            port: None,
        }
    }

    #[test]
    fn options_name_the_address_and_one_port_for_both_programs() {
        let p = plan(&VolumeMount {
            port: Some(3049),
            read_only: true,
            ..req("169.254.0.22:/v0-ab", "/data")
        })
        .unwrap();
        assert_eq!(p.source, "169.254.0.22:/v0-ab");
        assert_eq!(p.target, PathBuf::from("/data"));
        assert_eq!(
            p.data,
            "vers=3,proto=tcp,addr=169.254.0.22,port=3049,mountaddr=169.254.0.22,\
             mountport=3049,mountproto=tcp,nolock,hard"
        );
        assert!(p
            .flags
            .contains(MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV));
        let rw = plan(&req("10.0.0.1:/x", "/mnt/a b")).unwrap();
        assert!(rw.data.contains("port=2049,") && rw.data.contains("mountport=2049,"));
        assert!(!rw.flags.contains(MsFlags::MS_RDONLY));
    }

    #[test]
    fn bad_paths_and_targets_are_refused() {
        for path in ["", "/", "data", "/a/../b", "/a/./b", "/a//b", "/a/"] {
            let e = plan(&req("169.254.0.22:/v0", path)).unwrap_err();
            assert!(e.contains("must be absolute and clean"), "{path}: {e}");
        }
        for target in [
            "nfs.example:/v0",
            "169.254.0.22",
            "169.254.0.22:v0",
            "169.254.0.22:/v0,port=1",
            "169.254.0.22:/v 0",
        ] {
            let e = plan(&req(target, "/data")).unwrap_err();
            assert!(e.contains("nfs_target"), "{target}: {e}");
        }
        assert!(plan(&VolumeMount {
            port: Some(0),
            ..req("169.254.0.22:/v0", "/data")
        })
        .is_err());
    }

    #[test]
    fn finds_the_topmost_mount_on_a_path() {
        let info = "\
22 1 0:21 / / rw - overlay overlay rw
30 22 0:40 / /data rw,nosuid - nfs 169.254.0.22:/v0-aa rw,vers=3
31 30 0:41 / /data rw,nosuid - nfs 169.254.0.22:/v1-bb rw,vers=3
32 22 0:42 / /my\\040dir rw - nfs 169.254.0.22:/v2-cc rw
";
        assert_eq!(
            mounted_at(info, Path::new("/data")),
            Some(("nfs".into(), "169.254.0.22:/v1-bb".into()))
        );
        assert_eq!(
            mounted_at(info, Path::new("/my dir")),
            Some(("nfs".into(), "169.254.0.22:/v2-cc".into()))
        );
        assert_eq!(mounted_at(info, Path::new("/other")), None);
    }
}

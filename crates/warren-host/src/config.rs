//! The settings of this host's sandbox manager, shared by both runtimes.

use std::path::PathBuf;
use std::time::Duration;

use warren_net::NetConfig;

/// Settings of the host manager.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Persistent data: template images (`<data_dir>/images`).
    pub data_dir: PathBuf,
    /// Runtime state that dies with the host: per-sandbox directories.
    pub run_dir: PathBuf,
    /// Where template images are mounted (read-only, shared by every sandbox; kept mounted
    /// across server restarts).
    pub templates_dir: PathBuf,
    /// Where the namespace runtime mounts (or finds) the LXCFS daemon that shows each sandbox
    /// its own resources in `/proc/meminfo`, `/proc/cpuinfo` and the like. One daemon serves
    /// every sandbox and outlives server restarts (running sandboxes hold binds of its files);
    /// under `/run` it lives as long as the sandboxes can. `None`: sandboxes see the host's.
    pub lxcfs_dir: Option<PathBuf>,
    /// The agent every sandbox runs (see [`default_agent`]).
    pub agent_bin: PathBuf,
    pub nsinit_bin: PathBuf,
    /// First host id of the ranges sandboxes get (each its own 65536 ids, none overlapping
    /// `/etc/subuid`/`/etc/subgid`; see `warren_runtime_ns::idrange`).
    pub id_base: u32,
    /// Parent cgroup of all sandboxes.
    pub cgroup_parent: String,
    pub net: NetConfig,
    /// How long a new sandbox's agent may take to answer.
    pub ready_timeout: Duration,
    /// Longest lifetime of a signed file URL (seconds from each request); URLs without an
    /// expiration are then refused. `None`: no limit, as upstream E2B.
    pub signed_url_max_age: Option<std::num::NonZeroU64>,
}

impl HostConfig {
    /// What sandboxes' TLS clients are told to trust besides their image's store: the egress
    /// CA when secrets are brokered (template builds get nothing, so images stay clean).
    pub fn ca_bundle(&self) -> Option<&str> {
        self.net.broker.as_ref().map(|b| b.ca_pem())
    }

    /// Defaults for a host whose persistent data lives in `data_dir`; helper binaries are
    /// looked up next to the running executable.
    pub fn new(data_dir: PathBuf) -> Self {
        let bin_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/usr/local/bin"));
        Self {
            data_dir,
            run_dir: PathBuf::from("/run/warren"),
            templates_dir: PathBuf::from("/run/warren/templates"),
            lxcfs_dir: Some(PathBuf::from("/run/warren/lxcfs")),
            agent_bin: default_agent(&bin_dir),
            nsinit_bin: bin_dir.join("warren-nsinit"),
            // Above the ranges `useradd` hands out (100000 up to 600100000) and below 2^31.
            id_base: 1 << 30,
            cgroup_parent: "warren".into(),
            net: NetConfig::default(),
            ready_timeout: Duration::from_secs(30),
            signed_url_max_age: None,
        }
    }
}

/// The agent binary next to the server: `warren-agent-static` where it exists (scripts/setup.sh
/// builds it), else `warren-agent`. A statically linked agent runs in any image (glibc, musl
/// or no libc at all, as an image pulled from a registry may be); the plain build needs a
/// glibc in the image at least as new as the build host's.
pub fn default_agent(bin_dir: &std::path::Path) -> PathBuf {
    let fixed = bin_dir.join("warren-agent-static");
    if fixed.is_file() {
        fixed
    } else {
        bin_dir.join("warren-agent")
    }
}

/// Whether `path` is an ELF executable that needs no program interpreter (a static or
/// static-pie build): it has no `PT_INTERP` program header.
pub fn is_static_elf(path: &std::path::Path) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a 64-bit little-endian ELF file",
        )
    };
    let mut head = [0u8; 64];
    f.read_exact(&mut head).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => bad(),
        _ => e,
    })?;
    if &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return Err(bad());
    }
    let phoff = u64::from_le_bytes(head[0x20..0x28].try_into().map_err(|_| bad())?);
    let phentsize = u16::from_le_bytes([head[0x36], head[0x37]]) as u64;
    let phnum = u16::from_le_bytes([head[0x38], head[0x39]]) as u64;
    if phentsize < 4 {
        return Err(bad());
    }
    for i in 0..phnum {
        f.seek(SeekFrom::Start(phoff + i * phentsize))?;
        let mut kind = [0u8; 4];
        f.read_exact(&mut kind)?;
        // PT_INTERP
        if u32::from_le_bytes(kind) == 3 {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_is_not_static_and_garbage_is_an_error() {
        // /bin/sh on any Debian host is dynamically linked.
        assert!(!is_static_elf(std::path::Path::new("/bin/sh")).unwrap());
        let dir = std::env::temp_dir().join(format!("warren-elf-{}", std::process::id()));
        std::fs::write(&dir, b"#!/bin/sh\necho not elf\n").unwrap();
        let err = is_static_elf(&dir).unwrap_err();
        let _ = std::fs::remove_file(&dir);
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn the_static_agent_is_preferred_and_recognised() {
        let dir = std::env::temp_dir().join(format!("warren-agent-pick-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(default_agent(&dir), dir.join("warren-agent"));
        std::fs::write(dir.join("warren-agent-static"), b"").unwrap();
        assert_eq!(default_agent(&dir), dir.join("warren-agent-static"));
        std::fs::remove_dir_all(&dir).unwrap();
        let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/release/warren-agent-static");
        if built.is_file() {
            assert!(
                is_static_elf(&built).unwrap(),
                "{} should be static",
                built.display()
            );
        } else {
            warren_testkit::skip(format_args!(
                "{} not built (scripts/setup.sh builds it)",
                built.display()
            ));
        }
    }
}

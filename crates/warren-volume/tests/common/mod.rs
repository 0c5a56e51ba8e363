//! A test harness that makes real, loop-mounted volumes under a temporary directory and
//! unmounts and removes them afterwards. These tests need root and loop devices; without them
//! they fail with the reason, never pass quietly.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use warren_volume::{Content, Quota, VolumeError, VolumeHost};

pub const MIB: u64 = 1 << 20;

pub struct Harness {
    pub host: VolumeHost,
    /// The temporary directory; the volumes' root is `<tmp>/volumes`.
    pub tmp: Option<tempfile::TempDir>,
}

/// Checks the host can run these tests and makes an empty volumes root.
pub fn harness() -> Harness {
    assert!(
        rustix::process::geteuid().is_root(),
        "warren-volume's tests mount filesystems and need root; run them as root"
    );
    assert!(
        Path::new("/dev/loop-control").exists(),
        "warren-volume's tests need loop devices (/dev/loop-control is missing; modprobe loop?)"
    );
    for tool in [
        "mkfs.ext4",
        "resize2fs",
        "e2fsck",
        "mount",
        "umount",
        "losetup",
        "fsfreeze",
        "cp",
    ] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false)
            || Path::new("/usr/sbin").join(tool).is_file()
            || Path::new("/sbin").join(tool).is_file();
        assert!(found, "warren-volume's tests need `{tool}` on PATH");
    }
    let tmp = tempfile::Builder::new()
        .prefix("warren-volume-test-")
        .tempdir()
        .expect("making a temporary directory");
    let host = VolumeHost::open(&tmp.path().join("volumes")).expect("opening the volume host");
    Harness {
        host,
        tmp: Some(tmp),
    }
}

impl Harness {
    pub fn tmp(&self) -> &Path {
        self.tmp.as_ref().expect("tmp").path()
    }

    /// Creates volume `id` and panics with the reason if that fails (e.g. no loop device).
    pub fn create(&self, id: &str, bytes: u64, inodes: u64) -> Content {
        self.host
            .create(id, Quota { bytes, inodes })
            .unwrap_or_else(|e| panic!("creating volume {id}: {e}"));
        self.host.content(id).expect("opening the volume's content")
    }

    /// Mount points under this harness's directory, from /proc/self/mountinfo.
    pub fn mounts(&self) -> Vec<PathBuf> {
        mounts_under(self.tmp())
    }
}

pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("reading mountinfo");
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect()
}

impl Drop for Harness {
    fn drop(&mut self) {
        let root = self.host.root().to_path_buf();
        if let Ok(entries) = std::fs::read_dir(&root) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.starts_with('.') {
                    if let Err(err) = self.host.delete(&name) {
                        eprintln!("cleanup: deleting volume {name}: {err}");
                    }
                }
            }
        }
        let mut left = self.mounts();
        left.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for m in &left {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        if !self.mounts().is_empty() {
            // Never let the temporary directory's removal walk into a mounted volume.
            let tmp = self.tmp.take().expect("tmp").keep();
            eprintln!("cleanup: mounts remain under {}; leaving it", tmp.display());
        }
    }
}

pub fn read_all(c: &Content, path: &str) -> String {
    let (mut f, size) = c
        .open_file(path)
        .unwrap_or_else(|e| panic!("open_file {path}: {e}"));
    let mut s = String::new();
    f.read_to_string(&mut s).expect("reading");
    assert_eq!(s.len() as u64, size);
    s
}

pub fn write(c: &Content, path: &str, data: &str) -> Result<warren_volume::EntryStat, VolumeError> {
    c.write_file(path, &Default::default(), true, &mut data.as_bytes())
}

/// A harness whose volumes live on a disk of their own of `disk_mib` MiB (a tmpfs, which
/// allocates and punches like a disk), keeping `reserve_mib` of it free: for the tests of a
/// full host disk, which must not fill the real one.
pub fn harness_on_small_disk(disk_mib: u64, reserve_mib: u64) -> Harness {
    let mut h = harness();
    let disk = h.tmp().join("disk");
    std::fs::create_dir(&disk).expect("making the small disk's mount point");
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={disk_mib}m,mode=0700"))
        .arg("warren-volume-test")
        .arg(&disk)
        .status()
        .expect("running mount");
    assert!(ok.success(), "mounting a tmpfs as the small disk failed");
    h.host = VolumeHost::open(&disk.join("volumes"))
        .expect("opening the volume host")
        .with_reserve(reserve_mib * MIB);
    h
}

/// Bytes of the host's disk that `path` takes (its allocated blocks).
pub fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").blocks() * 512
}

//! The initramfs: a cpio ("newc") archive written here. It holds `/init` (the
//! `warren-vminit` binary), the shared libraries it links against, `/dev/console`, and the
//! kernel modules the guest needs, in load order, under `/modules` with `/modules/order`.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{run, Error, Result};
use crate::kernel::Kernel;

/// Modules the guest loads, dependencies first. The virtio transport, disks and network
/// (`virtio` must follow `virtio_ring`), the template image's erofs and the overlay, and the
/// NFSv3 client that mounts volumes (its declared dependencies make the load order `sunrpc
/// netfs fscache grace lockd nfs nfs_acl nfsv3`). Dependencies a module declares are added
/// before it automatically.
pub const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_blk",
    "failover",
    "net_failover",
    "virtio_net",
    "erofs",
    "overlay",
    "nfsv3",
];

/// Builds (or reuses) the initramfs for `kernel` and `vminit` under `cache_dir`; the file name
/// carries a hash of everything that goes in.
pub fn ensure(kernel: &Kernel, vminit: &Path, cache_dir: &Path) -> Result<PathBuf> {
    let order = module_order(kernel)?;
    let libs = shared_libraries(vminit)?;
    let mut hash = Sha256::new();
    hash.update(kernel.id());
    hash.update(std::fs::read(vminit).map_err(Error::io("read", vminit))?);
    for (name, _) in &order {
        hash.update(name);
    }
    for l in &libs {
        hash.update(l.to_string_lossy().as_bytes());
        hash.update(std::fs::read(l).map_err(Error::io("read", l))?);
    }
    let digest = format!("{:x}", hash.finalize());
    let out = cache_dir.join(format!("initramfs-{}.cpio", &digest[..12]));
    if out.exists() {
        return Ok(out);
    }
    std::fs::create_dir_all(cache_dir).map_err(Error::io("create", cache_dir))?;
    let _building = crate::cachelock::lock(&out)?;
    if out.exists() {
        return Ok(out);
    }
    let mut cpio = Cpio::default();
    for d in ["dev", "proc", "sys", "lower", "rw", "newroot", "modules"] {
        cpio.dir(d);
    }
    cpio.char_dev("dev/console", 5, 1);
    cpio.file("init", 0o755, read(vminit)?);
    for lib in &libs {
        let rel = lib.strip_prefix("/").unwrap_or(lib);
        let mut parent = PathBuf::new();
        for c in rel.parent().into_iter().flat_map(|p| p.components()) {
            parent.push(c);
            cpio.dir(&parent.to_string_lossy());
        }
        cpio.file(&rel.to_string_lossy(), 0o755, read(lib)?);
    }
    let mut names = String::new();
    for (name, path) in &order {
        cpio.file(&format!("modules/{name}.ko"), 0o644, read(path)?);
        names.push_str(name);
        names.push('\n');
    }
    cpio.file("modules/order", 0o644, names.into_bytes());
    let tmp = out.with_extension("partial");
    std::fs::write(&tmp, cpio.finish()).map_err(Error::io("write", &tmp))?;
    std::fs::rename(&tmp, &out).map_err(Error::io("rename to", &out))?;
    Ok(out)
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).map_err(Error::io("read", p))
}

/// [`MODULES`] with their declared dependencies, in load order, with their files.
pub fn module_order(kernel: &Kernel) -> Result<Vec<(String, PathBuf)>> {
    let mut files = std::collections::HashMap::new();
    index_modules(&kernel.modules, &mut files)?;
    let mut order: Vec<(String, PathBuf)> = Vec::new();
    let mut seen = BTreeSet::new();
    fn visit(
        name: &str,
        files: &std::collections::HashMap<String, PathBuf>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<(String, PathBuf)>,
    ) -> Result<()> {
        if !seen.insert(name.to_string()) {
            return Ok(());
        }
        let path = files
            .get(name)
            .ok_or_else(|| Error::ModuleMissing(name.to_string()))?;
        let bytes = std::fs::read(path).map_err(Error::io("read", path))?;
        for dep in declared_depends(&bytes) {
            visit(&dep, files, seen, order)?;
        }
        order.push((name.to_string(), path.clone()));
        Ok(())
    }
    for m in MODULES {
        visit(m, &files, &mut seen, &mut order)?;
    }
    Ok(order)
}

fn index_modules(dir: &Path, out: &mut std::collections::HashMap<String, PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).map_err(Error::io("list", dir))? {
        let p = e.map_err(Error::io("list", dir))?.path();
        if p.is_dir() {
            index_modules(&p, out)?;
        } else if let Some(n) = p.file_name().and_then(|n| n.to_str()) {
            if let Some(stem) = n.strip_suffix(".ko") {
                out.insert(stem.replace('-', "_"), p.clone());
            }
        }
    }
    Ok(())
}

/// The `depends=` entry of a module's `.modinfo` section (NUL-separated `key=value` strings).
fn declared_depends(ko: &[u8]) -> Vec<String> {
    let key = b"\0depends=";
    ko.windows(key.len())
        .position(|w| w == key)
        .map(|i| {
            let rest = &ko[i + key.len()..];
            let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end])
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.replace('-', "_"))
                .collect()
        })
        .unwrap_or_default()
}

/// The shared libraries (and the dynamic loader) `bin` needs, as `ldd` lists them.
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = run(Command::new("ldd").arg(bin))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// A cpio "newc" archive in memory.
#[derive(Default)]
pub struct Cpio {
    buf: Vec<u8>,
    ino: u32,
    dirs: BTreeSet<String>,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let namesize = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            if mode & 0o170000 == 0o040000 { 2 } else { 1 },
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            namesize,
            0
        );
        self.buf.extend_from_slice(header.as_bytes());
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    pub fn dir(&mut self, name: &str) {
        if self.dirs.insert(name.to_string()) {
            self.entry(name, 0o040755, (0, 0), &[]);
        }
    }

    pub fn file(&mut self, name: &str, perm: u32, data: Vec<u8>) {
        self.entry(name, 0o100000 | perm, (0, 0), &data);
    }

    pub fn char_dev(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020600, (major, minor), &[]);
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        let mut out = Vec::new();
        let _ = out.write_all(&self.buf);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_entries_are_aligned_and_terminated() {
        let mut c = Cpio::default();
        c.dir("dev");
        c.file("init", 0o755, b"abc".to_vec());
        let out = c.finish();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("TRAILER!!!"));
        // 110-byte header + "dev\0" padded to 116.
        assert_eq!(&out[116..122], b"070701");
    }

    #[test]
    fn reads_declared_dependencies() {
        let ko = b"xx\0license=GPL\0depends=virtio,virtio_ring\0name=x\0";
        assert_eq!(declared_depends(ko), vec!["virtio", "virtio_ring"]);
        assert!(declared_depends(b"\0depends=\0").is_empty());
    }
}

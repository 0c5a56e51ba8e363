//! The guest kernel: Debian's cloud kernel at a pinned version, unpacked without running any
//! maintainer script (no initramfs-tools: Warren builds its own initramfs).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{run, Error, Result};

/// The pinned kernel package (`linux-image-cloud-amd64` 6.1.176-1 depends on it). Override
/// with `warren serve --vm-kernel <package>=<version>` when the archive no longer carries it.
pub const KERNEL_PACKAGE: &str = "linux-image-6.1.0-50-cloud-amd64";
pub const KERNEL_VERSION: &str = "6.1.176-1";

/// Which Debian kernel package guests boot: [`KERNEL_PACKAGE`] at [`KERNEL_VERSION`] unless
/// the operator names another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPin {
    pub package: String,
    pub version: String,
}

impl Default for KernelPin {
    fn default() -> Self {
        Self {
            package: KERNEL_PACKAGE.into(),
            version: KERNEL_VERSION.into(),
        }
    }
}

impl std::str::FromStr for KernelPin {
    type Err = String;

    /// `<package>=<version>`, as apt names one version of a package.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.split_once('=') {
            Some((p, v)) if !p.is_empty() && !v.is_empty() => Ok(Self {
                package: p.into(),
                version: v.into(),
            }),
            _ => Err(format!("{s:?} is not <package>=<version>")),
        }
    }
}

/// An unpacked kernel package.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub package: String,
    pub version: String,
    /// `/boot/vmlinuz-*`.
    pub vmlinuz: PathBuf,
    /// `/lib/modules/<release>/kernel`.
    pub modules: PathBuf,
    /// `/boot/config-*`.
    pub config: PathBuf,
}

impl Kernel {
    /// `<package>=<version>`: recorded in snapshot keys and logs.
    pub fn id(&self) -> String {
        format!("{}={}", self.package, self.version)
    }
}

/// The unpacked kernel under `<data_dir>/vm/kernel/<package>_<version>`, downloaded (from
/// the host's Debian sources, with `apt-get download`) and unpacked on first use.
pub fn ensure(data_dir: &Path, pin: &KernelPin) -> Result<Kernel> {
    let (package, version) = (pin.package.clone(), pin.version.clone());
    let dir = data_dir
        .join("vm")
        .join("kernel")
        .join(format!("{package}_{version}"));
    let root = dir.join("root");
    let _building = if dir.join("complete").exists() {
        None
    } else {
        Some(crate::cachelock::lock(&dir)?)
    };
    if !dir.join("complete").exists() {
        let tmp = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(Error::io("create", &tmp))?;
        run(Command::new("apt-get")
            .arg("download")
            .arg(format!("{package}={version}"))
            .current_dir(&tmp))?;
        let deb = std::fs::read_dir(&tmp)
            .map_err(Error::io("list", &tmp))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "apt-get download left no .deb in {}",
                    tmp.display()
                ))
            })?;
        run(Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(tmp.join("root")))?;
        std::fs::remove_file(&deb).map_err(Error::io("remove", &deb))?;
        std::fs::write(tmp.join("complete"), format!("{package}={version}\n"))
            .map_err(Error::io("write", &tmp))?;
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(Error::io("rename to", &dir))?;
    }
    let boot = root.join("boot");
    let find = |prefix: &str| -> Result<PathBuf> {
        std::fs::read_dir(&boot)
            .map_err(Error::io("list", &boot))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .ok_or_else(|| Error::Invalid(format!("no {prefix}* in {}", boot.display())))
    };
    let vmlinuz = find("vmlinuz-")?;
    let config = find("config-")?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .unwrap_or_default()
        .to_string();
    let mut modules = root.join("lib/modules").join(&release);
    if !modules.exists() {
        modules = root.join("usr/lib/modules").join(&release);
    }
    Ok(Kernel {
        package,
        version,
        vmlinuz,
        modules: modules.join("kernel"),
        config,
    })
}

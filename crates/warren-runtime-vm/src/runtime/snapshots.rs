//! Template snapshots of this host, made on first use and kept on tmpfs under
//! `<run_dir>/vm/snapshots/<template>-<key>`.
//!
//! The key hashes everything the snapshot depends on: accelerator and CPU model, kernel
//! package, initramfs (which hashes `warren-vminit`), the agent binary, the template image,
//! memory, vCPUs, disk size and the kernel command line (which holds the DNS servers and the
//! host's TSC frequency), and the template's start command: a template with a service is
//! snapshotted with the service started and ready, so that its forks restore it running.
//! A snapshot is never restored under another accelerator or CPU model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::accel::{self, Accel};
use crate::snapshot::{self, Snapshot, TemplateSpec};
use sha2::{Digest, Sha256};
use warren_runtime::RuntimeError;

use super::VmSettings;

/// The boot inputs of a template, resolved (downloaded and built where needed).
pub struct Inputs {
    pub spec: TemplateSpec,
    /// How the template's sandboxes start (its service runs before the snapshot).
    pub launch: warren_template::Launch,
    pub key: String,
    pub dir: PathBuf,
}

/// Resolves kernel, initramfs and image for `template` (blocking: may download and build).
pub fn inputs(
    template: &str,
    size: super::Size,
    data_dir: &Path,
    snapshots_dir: &Path,
    settings: &VmSettings,
    accel: Accel,
    dns: &[std::net::Ipv4Addr],
) -> Result<Inputs, RuntimeError> {
    // A catalog template's image (built on first use) or one built from steps.
    let (image, _) = warren_host::image_of(template, data_dir)?;
    let launch = warren_template::launch(template, data_dir)
        .map_err(|e| warren_host::image_error(template, e))?;
    let kernel = crate::kernel::ensure(data_dir, &settings.kernel)
        .map_err(crate::Error::runtime("guest kernel"))?;
    let initrd = crate::initramfs::ensure(&kernel, &settings.vminit_bin, &data_dir.join("vm"))
        .map_err(crate::Error::runtime("initramfs"))?;
    let append = crate::qemu::kernel_cmdline(accel::host_tsc_khz(), template, dns);
    let agent = std::fs::read(&settings.agent_bin).map_err(RuntimeError::io(format!(
        "read {}",
        settings.agent_bin.display()
    )))?;
    // Which image file, not only its path: an image deleted and built again at the same path
    // has other bytes, and a snapshot's guest holds the old one's blocks in its page cache
    // (files then vanish or read as garbage in the VMs forked from it).
    let identity = {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&image)
            .map_err(RuntimeError::io(format!("stat {}", image.display())))?;
        format!("{}:{}:{}.{}", m.ino(), m.len(), m.mtime(), m.mtime_nsec())
    };
    let mut h = Sha256::new();
    // Bumped when the snapshot's layout or file modes change.
    h.update(b"warren-vm-snapshot-6\0");
    for part in [
        accel.as_str(),
        accel.cpu_model(),
        &kernel.id(),
        &initrd.display().to_string(),
        &image.display().to_string(),
        &identity,
        &settings.disk_mb.to_string(),
        &append,
        // The service the snapshot holds running (`None`: the agent only).
        &format!("{:?}", launch.start),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update(Sha256::digest(&agent));
    // The key: 8 hex digits for everything but the VM's size (the snapshot's "family":
    // snapshots of another family are outdated), 8 for the size too (snapshots of one
    // family and other sizes are current, for the template's sandboxes of those sizes).
    let family = format!("{:x}", h.clone().finalize());
    h.update(format!("{}/{}", size.memory_mb, size.cpus).as_bytes());
    let key = format!("{}{}", &family[..8], &format!("{:x}", h.finalize())[..8]);
    let spec = TemplateSpec {
        qemu: settings.qemu.clone(),
        accel,
        kernel: kernel.vmlinuz,
        initrd,
        append,
        root_image: image,
        agent_bin: settings.agent_bin.clone(),
        memory_mb: size.memory_mb,
        cpus: size.cpus,
        disk_mb: settings.disk_mb,
        tap: Some(warren_net::TAP_IFACE.into()),
        netns: None,
        boot_timeout: settings.boot_timeout,
        run_as: None,
    };
    Ok(Inputs {
        spec,
        launch,
        dir: snapshots_dir.join(format!("{template}-{key}")),
        key,
    })
}

/// An existing snapshot for `inputs`, if one was made before (also by an earlier server).
pub fn existing(inputs: &Inputs) -> Option<Arc<Snapshot>> {
    Snapshot::open(&inputs.dir).map(Arc::new)
}

/// Boots the template in network namespace `netns` (jailed as `run_as`), runs `prepare`
/// (starts its service) and snapshots it.
pub async fn make<F>(
    inputs: &Inputs,
    netns: PathBuf,
    run_as: Option<(u32, u32)>,
    prepare: F,
    in_use: Vec<PathBuf>,
) -> Result<Arc<Snapshot>, RuntimeError>
where
    F: std::future::Future<Output = Result<(), RuntimeError>>,
{
    let mut spec = inputs.spec.clone();
    spec.netns = Some(netns);
    spec.run_as = run_as;
    let snap = snapshot::create(&spec, &inputs.key, &inputs.dir, prepare)
        .await
        .map_err(crate::Error::runtime(format!(
            "snapshot template {}",
            inputs.key
        )))?;
    // Deleting older snapshots frees RAM-sized files: on the blocking pool.
    let current = inputs.dir.clone();
    let _ = tokio::task::spawn_blocking(move || remove_older(&current, &in_use)).await;
    tracing::info!(
        key = %inputs.key,
        accel = spec.accel.as_str(),
        boot_ms = snap.meta.boot_ms,
        service_ms = snap.meta.prepare_ms,
        "template snapshot ready"
    );
    Ok(Arc::new(snap))
}

/// Removes the other snapshots of the same template of another family (older agent, kernel,
/// image...; the first half of the key): they hold RAM on tmpfs. Those of the same family
/// are of other sizes, current. VMs restored from removed ones keep working: their QEMU has
/// the memory file mapped and the disk open, and unlinked files live on until closed.
/// Snapshots in `in_use` (the ones this process forks from) are never removed: an input that
/// drifts while the server runs (the kernel line's TSC frequency on a host that scales it)
/// must not take them away.
fn remove_older(current: &Path, in_use: &[PathBuf]) {
    let (Some(parent), Some(name)) = (current.parent(), current.file_name()) else {
        return;
    };
    let name = name.to_string_lossy();
    let Some((template, current_key)) = name.rsplit_once('-') else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let other = e.file_name().to_string_lossy().into_owned();
        // `<template>-<key>` and its builder's `<template>-<key>.lock`.
        let (dir_name, is_lock) = match other.strip_suffix(".lock") {
            Some(d) => (d, true),
            None => (other.as_str(), false),
        };
        let outdated = dir_name.rsplit_once('-').is_some_and(|(t, key)| {
            t == template && key.len() == 16 && key.get(..8) != current_key.get(..8)
        });
        if !outdated
            || in_use
                .iter()
                .any(|d| d.file_name() == Some(dir_name.as_ref()))
        {
            continue;
        }
        if is_lock {
            let _ = std::fs::remove_file(e.path());
        } else {
            tracing::info!(snapshot = %other, "removing an outdated template snapshot");
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::remove_older;

    #[test]
    fn only_snapshots_of_another_family_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let names = [
            "base-aaaaaaaa11111111",      // the current one
            "base-aaaaaaaa22222222",      // same family, another size: kept
            "base-bbbbbbbb11111111",      // outdated: removed
            "base-bbbbbbbb11111111.lock", // its builder's lock: removed
            "b0123-bbbbbbbb11111111",     // another template: kept
            "base-short",                 // not a snapshot's name: kept
            "base-cccccccc11111111",      // outdated but in use by this process: kept
        ];
        for n in names {
            if n.ends_with(".lock") {
                std::fs::write(tmp.path().join(n), "").unwrap();
            } else {
                std::fs::create_dir(tmp.path().join(n)).unwrap();
            }
        }
        remove_older(
            &tmp.path().join(names[0]),
            &[tmp.path().join("base-cccccccc11111111")],
        );
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "b0123-bbbbbbbb11111111",
                "base-aaaaaaaa11111111",
                "base-aaaaaaaa22222222",
                "base-cccccccc11111111",
                "base-short"
            ]
        );
    }
}

//! Warren's `vm` runtime (see docs/runtime-vm.md): [`VmRuntime`] implements the runtime trait
//! with one jailed QEMU microVM per sandbox, built from these blocks:
//!
//! * [`kernel`]: the pinned Debian cloud kernel, fetched with `apt-get download` and unpacked
//!   with `dpkg -x` into the data directory;
//! * [`initramfs`]: a cpio archive written here, holding `warren-vminit`, the shared libraries
//!   it needs and the kernel modules for virtio, erofs, overlayfs and the NFSv3 client;
//! * [`accel`]: whether KVM is truly usable (PVM is not) or TCG must be used;
//! * [`qmp`]: a small async client of QEMU's machine protocol;
//! * [`qemu`]: the `-M microvm` command line and the process;
//! * [`jail`]: the mount-namespace jail and unprivileged user every tenant-facing QEMU runs as;
//! * [`snapshot`]: template snapshots (boot once, snapshot with `x-ignore-shared`) and forks
//!   restored from them (`-incoming defer`, private copy-on-write memory, qcow2 disk overlay);
//! * [`checkpoint`]: a running VM's memory, device state and disk in the same format.

pub mod accel;
mod cachelock;
pub mod checkpoint;
mod console;
mod error;
pub mod flatten;
pub mod initramfs;
pub mod jail;
pub mod kernel;
mod pidfd;
pub mod qemu;
pub mod qmp;
mod restore;
mod runtime;
pub mod snapshot;

pub use accel::{choose as choose_accelerator, detect as detect_accelerator, Accel, Detection};
pub use error::{Error, Result};
pub use runtime::{uids, VmRuntime, VmSettings, STAGES_TARGET};

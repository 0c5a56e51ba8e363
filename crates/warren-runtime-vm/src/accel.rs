//! Which accelerator QEMU uses. `/dev/kvm` existing is not enough: on PVM hosts (nested
//! virtualisation without VMX/SVM) KVM accepts a stock guest and then crawls and dies, so KVM
//! counts as usable only with a real VMX/SVM CPU flag and no `kvm_pvm` module.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// The CPU model: `host` under KVM; `qemu64` under TCG (`max` breaks the guest's timer
    /// calibration there).
    pub fn cpu_model(self) -> &'static str {
        match self {
            Accel::Kvm => "host",
            Accel::Tcg => "qemu64",
        }
    }
}

/// The chosen accelerator and why.
#[derive(Debug, Clone)]
pub struct Detection {
    pub accel: Accel,
    pub reason: String,
}

impl std::str::FromStr for Accel {
    type Err = String;

    /// `kvm` or `tcg`, as `warren serve --vm-accel` takes it.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kvm" => Ok(Accel::Kvm),
            "tcg" => Ok(Accel::Tcg),
            other => Err(format!("{other:?} is not an accelerator (kvm or tcg)")),
        }
    }
}

/// The accelerator to use: `forced` if the operator named one (QEMU then fails loudly where
/// KVM is not usable), else what [`detect`] finds.
pub fn choose(forced: Option<Accel>) -> Detection {
    match forced {
        Some(accel) => Detection {
            accel,
            reason: format!("--vm-accel {}", accel.as_str()),
        },
        None => detect(),
    }
}

/// Detects whether KVM is truly usable here.
pub fn detect() -> Detection {
    let tcg = |reason: &str| Detection {
        accel: Accel::Tcg,
        reason: reason.into(),
    };
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return tcg("/dev/kvm cannot be opened");
    }
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        return tcg("/dev/kvm is PVM (kvm_pvm loaded), which cannot run a stock guest kernel");
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has_flag = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if !has_flag {
        return tcg("no vmx/svm CPU flag");
    }
    Detection {
        accel: Accel::Kvm,
        reason: "/dev/kvm opens, vmx/svm present, not PVM".into(),
    }
}

/// The host TSC frequency in kHz, for the guest's `tsc_early_khz=` (without it, boots under
/// TCG often hang in timer calibration).
pub fn host_tsc_khz() -> u64 {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|mhz| (mhz * 1000.0) as u64)
        .unwrap_or(2_000_000)
}

//! A network slot laid out for a microVM, and back.
//!
//! A slot as the pool builds it has the sandbox address 169.254.0.21 on its `eth0` (the
//! namespace sandbox lives right there). For a VM the guest holds that address behind a tap
//! device instead: the slot gives up 169.254.0.21, reaches the host through a fixed link-local
//! next hop, and routes 169.254.0.20/30 to `tap0`, which carries the guest's gateway
//! 169.254.0.22 with the gateway MAC every slot uses. The slot's NAT rules (they match `eth0`
//! and 169.254.0.21) stay as they are, so the guest sees exactly what a namespace sandbox
//! sees, and a snapshot taken in one slot restores into any other.

use std::io::Write;
use std::path::Path;

use crate::cmd::{Invocation, IP};
use crate::error::{Error, Result};
use crate::{
    Slot, GATEWAY_MAC, SANDBOX_ADDR, SANDBOX_GATEWAY, SANDBOX_IFACE, SANDBOX_PREFIX_LEN, TAP_IFACE,
};

/// The slot's next hop toward the host once it no longer holds the sandbox address.
const SLOT_NEXT_HOP: &str = "169.254.0.1";

fn to_vm_batch() -> String {
    format!(
        "address del {SANDBOX_ADDR}/{SANDBOX_PREFIX_LEN} dev {SANDBOX_IFACE}
neigh replace {SLOT_NEXT_HOP} lladdr {GATEWAY_MAC} dev {SANDBOX_IFACE} nud permanent
route replace default via {SLOT_NEXT_HOP} dev {SANDBOX_IFACE} onlink
tuntap add dev {TAP_IFACE} mode tap
link set dev {TAP_IFACE} address {GATEWAY_MAC}
link set dev {TAP_IFACE} addrgenmode none
address add {SANDBOX_GATEWAY}/{SANDBOX_PREFIX_LEN} dev {TAP_IFACE}
link set dev {TAP_IFACE} up
"
    )
}

fn to_ns_batch() -> String {
    format!(
        "link del dev {TAP_IFACE}
address add {SANDBOX_ADDR}/{SANDBOX_PREFIX_LEN} dev {SANDBOX_IFACE}
route replace default via {SANDBOX_GATEWAY} dev {SANDBOX_IFACE}
neigh del {SLOT_NEXT_HOP} dev {SANDBOX_IFACE}
"
    )
}

/// Sets `net.ipv4.ip_forward` inside the namespace (the slot now routes between `eth0` and
/// `tap0`). `/proc/sys/net` shows the network namespace of the thread that opens it, so a
/// short-lived thread joins the namespace for the write.
fn set_forwarding(netns: &Path, on: bool) -> Result<()> {
    let ns = netns.to_path_buf();
    let entered = std::thread::spawn(move || -> Result<()> {
        let f = std::fs::File::open(&ns).map_err(|e| Error::io(&ns, e))?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
            Error::EnterNetns {
                path: ns.clone(),
                source: e.into(),
            }
        })?;
        let sysctl = Path::new("/proc/sys/net/ipv4/ip_forward");
        std::fs::OpenOptions::new()
            .write(true)
            .open(sysctl)
            .and_then(|mut p| p.write_all(if on { b"1\n" } else { b"0\n" }))
            .map_err(|e| Error::io(sysctl, e))
    })
    .join();
    entered.unwrap_or_else(|_| {
        Err(Error::Io {
            path: netns.to_path_buf(),
            source: std::io::Error::other("the thread setting forwarding panicked"),
        })
    })
}

async fn forwarding(slot: &Slot, on: bool) -> Result<()> {
    let ns = slot.netns_path();
    tokio::task::spawn_blocking(move || set_forwarding(&ns, on))
        .await
        .map_err(|_| Error::RuntimeShutdown)?
}

impl Slot {
    /// Lays the slot out for a VM (tap device, routes). Undone by [`Slot::lay_out_for_ns`].
    pub async fn lay_out_for_vm(&self) -> Result<()> {
        forwarding(self, true).await?;
        let batch = Invocation::new(IP)
            .args(["-n", self.name(), "-batch", "-"])
            .stdin(to_vm_batch())
            .run()
            .await;
        if let Err(e) = batch {
            let _ = self.lay_out_for_ns().await;
            return Err(e);
        }
        Ok(())
    }

    /// Gives the slot back its namespace-sandbox layout, as the pool expects it on release.
    /// Best effort per step (`ip -force`): a half-done layout is repaired as far as possible.
    pub async fn lay_out_for_ns(&self) -> Result<()> {
        let batch = Invocation::new(IP)
            .args(["-n", self.name(), "-force", "-batch", "-"])
            .stdin(to_ns_batch())
            .ok_codes(&[1])
            .run()
            .await;
        if let Err(e) = batch {
            tracing::debug!(slot = self.name(), error = %e, "restoring the namespace layout");
        }
        forwarding(self, false).await
    }
}

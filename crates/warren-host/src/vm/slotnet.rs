//! A network slot laid out for a microVM.
//!
//! A slot as `warren-net` builds it has the sandbox address 169.254.0.21 on its `eth0` (the
//! namespace sandbox lives right there). For a VM the guest holds that address behind a tap
//! device instead: the slot gives up 169.254.0.21, reaches the host through a fixed link-local
//! next hop, and routes 169.254.0.20/30 to `tap0`, which carries the guest's gateway
//! 169.254.0.22 with the gateway MAC every slot uses. The slot's NAT rules (they match `eth0`
//! and 169.254.0.21) stay as they are, so the guest sees exactly what a namespace sandbox
//! sees, and a snapshot taken in one slot restores into any other.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use warren_net::{
    Slot, GATEWAY_MAC, SANDBOX_ADDR, SANDBOX_GATEWAY, SANDBOX_IFACE, SANDBOX_PREFIX_LEN, TAP_IFACE,
};
use warren_runtime::RuntimeError;

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

async fn ip_batch(netns: &str, batch: String, force: bool) -> Result<(), RuntimeError> {
    let mut cmd = tokio::process::Command::new("ip");
    cmd.args(["-n", netns]);
    if force {
        cmd.arg("-force");
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| RuntimeError::Failed(format!("run ip: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        stdin
            .write_all(batch.as_bytes())
            .await
            .map_err(|e| RuntimeError::Failed(format!("ip -batch: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| RuntimeError::Failed(format!("ip -batch: {e}")))?;
    if !out.status.success() && !force {
        return Err(RuntimeError::Failed(format!(
            "slot {netns}: ip -batch: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Sets `net.ipv4.ip_forward` inside the namespace (the slot now routes between `eth0` and
/// `tap0`). `/proc/sys/net` shows the network namespace of the thread that opens it, so a
/// short-lived thread joins the namespace for the write.
fn set_forwarding(netns: &Path, on: bool) -> Result<(), RuntimeError> {
    let ns = netns.to_path_buf();
    std::thread::spawn(move || -> std::io::Result<()> {
        let f = std::fs::File::open(&ns)?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        let mut p = std::fs::OpenOptions::new()
            .write(true)
            .open("/proc/sys/net/ipv4/ip_forward")?;
        p.write_all(if on { b"1\n" } else { b"0\n" })
    })
    .join()
    .map_err(|_| RuntimeError::Failed("forwarding thread panicked".into()))?
    .map_err(|e| RuntimeError::Failed(format!("enable forwarding in {}: {e}", netns.display())))
}

/// Lays the slot out for a VM (tap device, routes). Undone by [`to_ns`].
pub async fn to_vm(slot: &Slot) -> Result<(), RuntimeError> {
    let ns = slot.netns_path();
    tokio::task::spawn_blocking(move || set_forwarding(&ns, true))
        .await
        .map_err(|e| RuntimeError::Failed(e.to_string()))??;
    if let Err(e) = ip_batch(slot.name(), to_vm_batch(), false).await {
        let _ = to_ns(slot).await;
        return Err(e);
    }
    Ok(())
}

/// Gives the slot back its namespace-sandbox layout, as the pool expects it on release.
/// Best effort per step: a half-done layout is repaired as far as possible.
pub async fn to_ns(slot: &Slot) -> Result<(), RuntimeError> {
    ip_batch(slot.name(), to_ns_batch(), true).await?;
    let ns = slot.netns_path();
    tokio::task::spawn_blocking(move || set_forwarding(&ns, false))
        .await
        .map_err(|e| RuntimeError::Failed(e.to_string()))?
}

//! Runs a command against guest agents inside real VM sandboxes: creates one open and one
//! secured sandbox with the vm runtime, runs the command with `WARREN_AGENT_URL`,
//! `WARREN_AGENT_SECURED_URL` and `WARREN_AGENT_ACCESS_TOKEN` pointing at them, then removes
//! everything and exits with the command's status. Used to run the agent conformance suite
//! against an agent in a microVM:
//!
//! ```text
//! cargo run --release --example vm_agents -- .venv/bin/python -m pytest tests/agent -q
//! ```
//!
//! Needs root, QEMU and the base template image (`WARREN_DATA_DIR`, default /var/lib/warren).
//! It uses its own state directory, slot prefix and addresses, so it never touches a server's.

use std::collections::BTreeMap;
use std::path::PathBuf;

use warren_host::HostConfig;
use warren_runtime::{CreateSpec, SandboxRuntime};
use warren_runtime_vm::{VmRuntime, VmSettings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(!args.is_empty(), "usage: vm_agents <command> [args...]");
    let data = std::env::var_os("WARREN_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/warren"));
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    let mut cfg = HostConfig::new(data);
    cfg.agent_bin = bin.join("warren-agent");
    cfg.run_dir = PathBuf::from("/run/warren-vm-agents");
    cfg.cgroup_parent = "warren-vm-agents".into();
    cfg.net.prefix = "wvagent".into();
    cfg.net.host_cidr = "10.16.0.0/28".parse()?;
    cfg.net.run_dir = cfg.run_dir.join("net");
    cfg.net.pool_size = 2;
    let mut vm = VmSettings::new(&cfg);
    vm.warm_pool = 0;
    let rt = VmRuntime::start(cfg.clone(), vm).await?;
    rt.reattach(vec![]).await;
    let token = format!("tok{}", std::process::id());
    let spec = |id: &str, token: Option<String>| CreateSpec {
        volumes: Vec::new(),
        id: id.parse().expect("a valid sandbox id"),
        template: "base".into(),
        resources: warren_runtime::Resources {
            cpu_count: 1,
            memory_mb: 512,
            disk_mb: 2048,
        },
        allow_internet_access: false,
        egress: Default::default(),
        env_vars: BTreeMap::new(),
        access_token: token,
        from_snapshot: None,
        reservation: None,
    };
    let result = async {
        let open = rt.create(spec("conformance", None)).await?;
        let secured = rt.create(spec("secured", Some(token.clone()))).await?;
        eprintln!(
            "agents in VMs: open http://{}, secured http://{}",
            open.agent, secured.agent
        );
        let status = tokio::process::Command::new(&args[0])
            .args(&args[1..])
            .env("WARREN_AGENT_URL", format!("http://{}", open.agent))
            .env(
                "WARREN_AGENT_SECURED_URL",
                format!("http://{}", secured.agent),
            )
            .env("WARREN_AGENT_ACCESS_TOKEN", &token)
            .status()
            .await?;
        anyhow::Ok(status.code().unwrap_or(1))
    }
    .await;
    rt.shutdown().await?;
    let _ = std::fs::remove_dir_all(&cfg.run_dir);
    std::process::exit(result?);
}

fn tracing_subscriber_init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WARREN_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

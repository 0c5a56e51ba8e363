//! `warren serve`: store, runtime, recovery, then the HTTP listener.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use warren_control::{Config, Control};
use warren_runtime::SandboxRuntime;
use warren_server::ServerConfig;
use warren_store::SqliteStore;

use crate::{RuntimeKind, KEY_FILE};

pub struct ServeArgs {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Largest upload of a template build's COPY files, in MiB (compressed and unpacked).
    pub max_upload_mb: u64,
    /// MiB of the data disk every writer leaves free (pauses, snapshots, volumes, uploads,
    /// builds).
    pub min_free_mb: u64,
    /// MiB a volume gets when its create names no size.
    pub volume_size_mb: u64,
    /// Longest a template build may run, all steps together.
    pub build_timeout_secs: u64,
    pub runtime: RuntimeKind,
    pub max_sandboxes: usize,
    pub metrics_per_sandbox: bool,
    pub webhooks_to_private_addresses: bool,
    pub domain: Option<String>,
    /// Cap on signed file URLs' lifetime, handed to every sandbox's agent (`None`: no cap).
    pub signed_url_max_age: Option<std::num::NonZeroU64>,
    /// How `fromImage` builds reach registries.
    pub registry: RegistryArgs,
    pub net: NetArgs,
    pub tls: TlsArgs,
    pub telemetry: TelemetryArgs,
    pub runtimes: RuntimeArgs,
}

/// Settings of the two runtimes (`docs/runtime-ns.md`, `docs/runtime-vm.md`).
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// ns runtime: most sandboxes kept started ahead of creates (as many as recent demand
    /// asks for, within this and an eighth of the host's free memory); 0 prepares none.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub ns_prepared_max: usize,
    /// ns runtime: `baseline` gives sandboxes the earlier, weaker confinement (a short
    /// seccomp deny-list, every capability in their user namespace), to measure what
    /// confinement costs; never for real tenants (the server warns at start).
    #[arg(long, value_name = "full|baseline", default_value = "full")]
    pub ns_confinement: warren_runtime_ns::config::Confinement,
    /// vm runtime: guest RAM, in MiB, of the catalog templates' VMs (`base`, the code
    /// interpreter); a built template's VMs get the template's memoryMB.
    #[arg(long, value_name = "MIB", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(128..=65536))]
    pub vm_memory_mb: u32,
    /// vm runtime: QEMUs kept waiting for a snapshot, per template.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vm_warm_pool: usize,
    /// vm runtime: the accelerator, `kvm` or `tcg` (default: KVM where it is truly usable,
    /// else TCG). A forced `kvm` fails loudly where KVM cannot run a guest.
    #[arg(long, value_name = "kvm|tcg")]
    pub vm_accel: Option<warren_runtime_vm::Accel>,
    /// vm runtime: the Debian kernel package guests boot, as `<package>=<version>` (default:
    /// the pinned one), when the archive no longer carries the pin.
    #[arg(long, value_name = "PACKAGE=VERSION")]
    pub vm_kernel: Option<warren_runtime_vm::kernel::KernelPin>,
}

impl RuntimeArgs {
    fn ns(&self) -> warren_runtime_ns::NsSettings {
        warren_runtime_ns::NsSettings {
            prepared_max: self.ns_prepared_max,
            confinement: self.ns_confinement,
        }
    }

    fn vm(&self, cfg: &warren_host::HostConfig) -> warren_runtime_vm::VmSettings {
        let mut vm = warren_runtime_vm::VmSettings::new(cfg);
        vm.memory_mb = self.vm_memory_mb;
        vm.warm_pool = self.vm_warm_pool;
        vm.accel = self.vm_accel;
        if let Some(pin) = &self.vm_kernel {
            vm.kernel = pin.clone();
        }
        vm
    }
}

/// What the server tells others about itself and its sandboxes (`docs/observability.md`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TelemetryArgs {
    /// An OpenTelemetry collector's OTLP/HTTP base URL (e.g. http://127.0.0.1:4318): traces,
    /// metrics and logs are posted to its /v1/traces, /v1/metrics and /v1/logs. Default:
    /// OTEL_EXPORTER_OTLP_ENDPOINT; with neither, nothing is exported. OTEL_SERVICE_NAME and
    /// OTEL_EXPORTER_OTLP_HEADERS are honoured.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Do not read sandboxes' journals: no audit trail, no sandbox logs, no exec spans
    /// (to measure what the trail costs).
    #[arg(long)]
    pub no_audit: bool,
    /// Audit entries one sandbox may have kept per second on average (default 10); past it
    /// and its burst, entries are counted in an `audit.dropped` entry instead of kept.
    #[arg(long, value_name = "N")]
    pub audit_rate: Option<u32>,
    /// Audit entries one sandbox may have kept in one go (default 1000).
    #[arg(long, value_name = "N")]
    pub audit_burst: Option<u32>,
    /// MiB one sandbox's audit entries may take in the store over the 7-day retention
    /// (default 64).
    #[arg(long, value_name = "MIB")]
    pub audit_sandbox_mb: Option<u64>,
    /// No audit entry is written while the data disk has less than this many MiB free
    /// (default 2048, above the 1 GiB that pauses and snapshots need).
    #[arg(long, value_name = "MIB")]
    pub audit_min_free_mb: Option<u64>,
}

impl TelemetryArgs {
    /// The audit trail's bounds: the defaults, with what was given on the command line.
    pub fn audit_budget(&self) -> warren_control::AuditBudget {
        const MIB: u64 = 1024 * 1024;
        let d = warren_control::AuditBudget::default();
        warren_control::AuditBudget {
            entries_per_second: self.audit_rate.unwrap_or(d.entries_per_second),
            burst: self.audit_burst.unwrap_or(d.burst),
            sandbox_bytes: self
                .audit_sandbox_mb
                .map_or(d.sandbox_bytes, |m| m.saturating_mul(MIB)),
            min_free_bytes: self
                .audit_min_free_mb
                .map_or(d.min_free_bytes, |m| m.saturating_mul(MIB)),
            ..d
        }
    }

    /// The exporter, if an endpoint is named; it sends on `runtime`.
    pub fn exporter(
        &self,
        runtime: tokio::runtime::Handle,
    ) -> anyhow::Result<Option<Arc<warren_server::otel::Otel>>> {
        use warren_server::otel::{Otel, OtelSettings};
        let Some(settings) =
            OtelSettings::resolve(self.otlp_endpoint.as_deref(), |k| std::env::var(k).ok())?
        else {
            return Ok(None);
        };
        Ok(Some(Arc::new(Otel::start(settings, runtime)?)))
    }
}

/// HTTPS in domain mode (`docs/networking.md`, "Ingress").
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Where HTTPS is served with --domain (default 0.0.0.0:443).
    #[arg(long, value_name = "ADDR")]
    pub tls_listen: Option<SocketAddr>,
    /// No HTTPS listener with --domain (a TLS terminator in front forwards to --listen).
    #[arg(long, conflicts_with_all = ["tls_listen", "tls_cert", "tls_key"])]
    pub no_tls: bool,
    /// The certificate chain to serve (PEM, leaf first; it should name `*.<domain>`). Without
    /// it, a local CA in the data dir issues one, and clients trust the CA's certificate.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    fn any_set(&self) -> bool {
        self.tls_listen.is_some() || self.no_tls || self.tls_cert.is_some()
    }
}

/// Where the local CA of `domain` lives in the data dir.
pub fn local_ca_dir(data_dir: &Path, domain: &str) -> PathBuf {
    data_dir.join("tls").join(domain)
}

/// The HTTPS listener of domain mode, bound, with the certificate it serves.
async fn tls_listener(
    args: &TlsArgs,
    domain: &str,
    data_dir: &Path,
) -> anyhow::Result<Option<warren_server::TlsListener>> {
    if args.no_tls {
        return Ok(None);
    }
    let certs = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let certs = warren_tls::ServerCerts::from_files(cert, key)
                .context("loading --tls-cert and --tls-key")?;
            for name in [format!("api.{domain}"), format!("49983-x.{domain}")] {
                if !certs.covers(&name) {
                    tracing::warn!(
                        cert = %cert.display(),
                        names = ?certs.names(),
                        "the certificate does not name {name}: clients will refuse it there"
                    );
                }
            }
            tracing::info!(cert = %cert.display(), "HTTPS with the operator's certificate");
            certs
        }
        _ => {
            let dir = local_ca_dir(data_dir, domain);
            let (ca, created) = warren_tls::LocalCa::load_or_create(&dir, domain)
                .context("the local certificate authority")?;
            let path = ca.cert_path().display().to_string();
            if created {
                tracing::info!(ca = %path, "created a local certificate authority for *.{domain}");
            }
            // Clients need the path; it is not a secret (the key beside it is, and stays 0600).
            let hint = "SSL_CERT_FILE, NODE_EXTRA_CA_CERTS or the system store";
            tracing::info!(
                ca = %path,
                "HTTPS with a certificate of the local CA: clients trust {path} ({hint})"
            );
            warren_tls::ServerCerts::issued(ca, vec![domain.to_string(), format!("*.{domain}")])
                .context("issuing the server certificate")?
        }
    };
    let addr = args
        .tls_listen
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 443)));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening for HTTPS on {addr}"))?;
    tracing::info!(listen = %addr, "HTTPS for api.{domain} and <port>-<sandboxID>.{domain}");
    Ok(Some(warren_server::TlsListener {
        listener,
        config: warren_tls::server_config(std::sync::Arc::new(certs))?,
    }))
}

/// Network settings of `warren serve` (the operator's, never a sandbox creator's).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NetArgs {
    /// A private, link-local or other special range sandboxes may reach all the same (e.g. a
    /// company network); by default they reach none. Repeatable.
    #[arg(long = "net-allow", value_name = "CIDR")]
    pub allow: Vec<warren_net::Ipv4Cidr>,
    /// A DNS server for sandboxes (and for the resolver of sandboxes with rules by name)
    /// instead of the host's; repeatable, at most three are used.
    #[arg(long = "dns", value_name = "IPV4")]
    pub dns: Vec<std::net::Ipv4Addr>,
    /// A PEM file of root certificates the egress proxy also trusts when it brokers secrets
    /// to a host (`network.rules` over HTTPS), besides the host's store; repeatable.
    #[arg(long = "egress-ca", value_name = "FILE")]
    pub egress_ca: Vec<PathBuf>,
}

impl NetArgs {
    fn apply(&self, net: &mut warren_net::NetConfig) {
        net.allow_destinations(&self.allow);
        if !self.dns.is_empty() {
            net.dns = warren_net::DnsSource::Servers(self.dns.clone());
        }
    }
}

/// Registry settings of `warren serve` (for templates built from registry images).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RegistryArgs {
    /// A mirror that replaces a registry for image pulls, as REGISTRY=URL (e.g.
    /// `docker.io=https://mirror.example:5000`); repeat for more registries. The origin is never
    /// contacted for a mirrored registry.
    #[arg(long = "registry-mirror", value_name = "REGISTRY=URL")]
    pub mirrors: Vec<warren_oci::Mirror>,
    /// A registry (host:port) reached over plain HTTP instead of HTTPS; repeatable.
    #[arg(long = "registry-insecure", value_name = "HOST:PORT")]
    pub insecure: Vec<String>,
    /// A PEM file of extra CA certificates trusted for registries; repeatable.
    #[arg(long = "registry-ca", value_name = "FILE")]
    pub ca_files: Vec<PathBuf>,
    /// A range (CIDR or address) or HOST:PORT that image pulls may reach although it is
    /// loopback, private, link-local, CGNAT or another refused range; repeatable. Mirrors and
    /// `--registry-insecure` registries are allowed without it.
    #[arg(long = "registry-allow", value_name = "CIDR|HOST:PORT")]
    pub allow: Vec<warren_oci::RegistryAllow>,
}

async fn runtime(
    kind: RuntimeKind,
    settings: &RuntimeArgs,
    data_dir: &Path,
    signed_url_max_age: Option<std::num::NonZeroU64>,
    net: &NetArgs,
    broker: Arc<warren_net::Broker>,
) -> anyhow::Result<Arc<dyn SandboxRuntime>> {
    let kind = match kind {
        RuntimeKind::Auto => {
            let d = warren_runtime_vm::choose_accelerator(settings.vm_accel);
            let pick = if d.accel == warren_runtime_vm::Accel::Kvm {
                RuntimeKind::Vm
            } else {
                RuntimeKind::Ns
            };
            let name = if matches!(pick, RuntimeKind::Vm) {
                "vm"
            } else {
                "ns"
            };
            tracing::info!(runtime = name, reason = %d.reason, "--runtime auto");
            pick
        }
        k => k,
    };
    let mut cfg = warren_host::HostConfig::new(data_dir.to_path_buf());
    cfg.signed_url_max_age = signed_url_max_age;
    net.apply(&mut cfg.net);
    cfg.net.broker = Some(broker);
    match warren_host::is_static_elf(&cfg.agent_bin) {
        Ok(true) => {
            tracing::info!(agent = %cfg.agent_bin.display(), "sandbox agent (statically linked)")
        }
        Ok(false) => tracing::warn!(
            agent = %cfg.agent_bin.display(),
            "the sandbox agent is dynamically linked: images without a glibc as new as this \
             host's (e.g. ones pulled from a registry) cannot run it; scripts/setup.sh builds \
             warren-agent-static"
        ),
        Err(e) => {
            tracing::warn!(agent = %cfg.agent_bin.display(), error = %warren_runtime::chain(&e), "cannot read the sandbox agent")
        }
    }
    match kind {
        RuntimeKind::Vm => {
            let vm = settings.vm(&cfg);
            let rt = warren_runtime_vm::VmRuntime::start(cfg, vm)
                .await
                .context("starting the vm runtime (it needs root and QEMU)")?;
            Ok(rt)
        }
        RuntimeKind::Auto | RuntimeKind::Ns => {
            let rt = warren_runtime_ns::NsRuntime::start(cfg, settings.ns())
                .await
                .context("starting the namespace runtime (it needs root)")?;
            Ok(rt)
        }
    }
}

/// Opens the store, seeds keys, reattaches sandboxes, serves until Ctrl-C / SIGTERM.
pub async fn run(
    args: ServeArgs,
    otel: Option<Arc<warren_server::otel::Otel>>,
) -> anyhow::Result<()> {
    raise_nofile();
    let domain = match &args.domain {
        Some(d) if !warren_tls::valid_domain(d) => {
            anyhow::bail!("--domain {d:?} is not a domain name (e.g. sbx.example.com)")
        }
        Some(d) => Some(d.to_ascii_lowercase()),
        None if args.tls.any_set() => anyhow::bail!("the --tls-* options need --domain"),
        None => None,
    };
    private_data_dir(&args.data_dir)?;
    let _serving = lock_data_dir(&args.data_dir)?;
    let store =
        Arc::new(SqliteStore::open(&args.data_dir.join("warren.db")).context("opening the store")?);
    // Bind before starting sandboxes' recovery so a port clash fails fast.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let tls = match &domain {
        Some(d) => tls_listener(&args.tls, d, &args.data_dir).await?,
        None => None,
    };
    let secrets = Arc::new(crate::brokering::ControlSecrets::default());
    let broker = crate::brokering::broker(&args.data_dir, &args.net.egress_ca, secrets.clone())?;
    let runtime = runtime(
        args.runtime,
        &args.runtimes,
        &args.data_dir,
        args.signed_url_max_age,
        &args.net,
        broker,
    )
    .await?;
    let config = Config {
        max_concurrent: args.max_sandboxes,
        per_sandbox_metrics: args.metrics_per_sandbox,
        audit: !args.telemetry.no_audit,
        audit_budget: args.telemetry.audit_budget(),
        min_free_bytes: args.min_free_mb.saturating_mul(1024 * 1024),
        volume_bytes: args.volume_size_mb.saturating_mul(1024 * 1024),
        domain: domain.clone(),
        template_names: warren_template::TEMPLATES
            .iter()
            .map(|t| t.to_string())
            .collect(),
        ..Config::default()
    };
    // Volumes: one filesystem image each under the data dir, mounted on the host.
    let volumes = Arc::new(
        warren_volume::VolumeHost::open(&args.data_dir.join("volumes"))
            .context("opening the volume store")?
            .with_reserve(args.min_free_mb.saturating_mul(1024 * 1024)),
    );
    // The proxy the API serves sandbox traffic through also reads the guests' metrics and
    // journals for the control plane.
    let proxy = Arc::new(warren_server::proxy::Proxy::new(domain.clone()));
    // Template builds run in build sandboxes of this same runtime.
    let builder = warren_build::Builder::new(
        runtime.clone(),
        warren_build::BuilderConfig {
            data_dir: args.data_dir.clone(),
            max_upload_bytes: args.max_upload_mb.saturating_mul(1024 * 1024),
            min_free_bytes: args.min_free_mb.saturating_mul(1024 * 1024),
            build_timeout: std::time::Duration::from_secs(args.build_timeout_secs),
            pull: Some(warren_oci::PullOptions {
                mirrors: args.registry.mirrors.clone(),
                insecure: args.registry.insecure.clone(),
                ca_files: args.registry.ca_files.clone(),
                allow: args.registry.allow.clone(),
                min_free_bytes: args.min_free_mb.saturating_mul(1024 * 1024),
                ..warren_oci::PullOptions::new(args.data_dir.join("oci"))
            }),
        },
    );
    let mut control = Control::builder(store, runtime.clone(), config)
        .templates(Arc::new(builder))
        .volumes(Arc::new(warren_adapters::HostDisks(volumes.clone())))
        .guest_metrics(proxy.clone())
        .webhooks(Arc::new(warren_adapters::HttpWebhookSender {
            allow_private: args.webhooks_to_private_addresses,
            encode: warren_server::event_payload,
        }));
    if let Some(o) = &otel {
        control = control.audit_observer(o.audit_export());
    }
    let control = control.start().await.context("recovering sandboxes")?;
    secrets.bind(control.clone());
    if let Some(o) = &otel {
        o.attach(&control);
        tracing::info!(
            endpoint = %o.settings().endpoint,
            service = %o.settings().service_name,
            "exporting traces, metrics and logs over OTLP"
        );
    }
    // The base template is what every SDK asks for by default: have it ready before taking
    // requests (its image built with visible progress on the very first start; for the vm
    // runtime its boot snapshot too, so no create ever boots a kernel). After recovery: the
    // runtime must see the previous run's state first.
    runtime
        .prepare_template("base")
        .await
        .context("preparing the base template")?;
    ensure_key(&control, &args.data_dir).await?;
    control
        .sweep_volumes()
        .await
        .context("sweeping volumes no record names")?;
    // An upload that was replacing a file when the server died may have left its temporary
    // name; no upload runs yet, so every such name is a leftover.
    let sweeping = volumes.clone();
    let started = std::time::SystemTime::now();
    tokio::task::spawn_blocking(move || {
        for id in sweeping.volume_ids().unwrap_or_default() {
            match sweeping
                .content(&id)
                .and_then(|c| c.remove_leftover_uploads(started))
            {
                Ok(0) => {}
                Ok(n) => tracing::info!(volume = %id, removed = n, "removed leftover uploads"),
                Err(e) => {
                    tracing::warn!(volume = %id, error = %warren_runtime::chain(&e), "sweeping leftover uploads")
                }
            }
        }
    });

    let app = warren_server::app(
        control.clone(),
        proxy,
        ServerConfig {
            domain,
            volumes: Some(volumes),
            ..Default::default()
        },
    );
    tracing::info!(listen = %args.listen, "warren serving API and sandbox proxy");
    warren_server::serve_all(
        listener,
        tls,
        app,
        warren_server::ListenerLimits::default(),
        shutdown_signal(),
    )
    .await
    .context("serving")?;
    control.shutdown();
    runtime.stop().await;
    if let Some(o) = otel {
        // The last spans and the final metrics, sent on this runtime while it still runs.
        let _ = tokio::task::spawn_blocking(move || o.shutdown()).await;
    }
    Ok(())
}

/// Held while `warren serve` uses `data_dir` (`<data_dir>/serve.lock`): `warren store
/// rotate-key` needs the server stopped, and two servers must not share a store.
pub fn lock_data_dir(data_dir: &Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    let path = data_dir.join("serve.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        if e == nix::errno::Errno::EWOULDBLOCK {
            anyhow::anyhow!(
                "a warren server is using {} ({} is locked); stop it first",
                data_dir.display(),
                path.display()
            )
        } else {
            anyhow::anyhow!("locking {}: {e}", path.display())
        }
    })
}

/// `WARREN_API_KEY` seeds a known key; otherwise a first start creates one, prints it once and
/// leaves it (0600) in the data dir for the local CLI.
async fn ensure_key(control: &Control, data_dir: &Path) -> anyhow::Result<()> {
    if let Ok(secret) = std::env::var("WARREN_API_KEY") {
        if !secret.is_empty() {
            if !warren_control::sdk_accepts_key(&secret) {
                tracing::warn!(
                    "WARREN_API_KEY is not in E2B's key format (e2b_ and lowercase hex digits): \
                     newer e2b SDKs refuse it before sending; `warren keys create` makes one"
                );
            }
            control
                .keys()
                .seed_api_key("WARREN_API_KEY", &secret)
                .await
                .context("seeding WARREN_API_KEY")?;
            return Ok(());
        }
    }
    let active = control
        .keys()
        .api_keys()
        .await?
        .iter()
        .filter(|k| k.revoked_at.is_none())
        .count();
    if active > 0 {
        return Ok(());
    }
    let new = control.keys().create_api_key("initial").await?;
    let path = data_dir.join(KEY_FILE);
    crate::keys::write_key_file(&path, &new.secret)?;
    // Shown once to the person at the terminal; never written where logs go (under systemd
    // stderr is the journal, which other groups may read): there only the file is named.
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        eprintln!(
            "\nCreated API key (shown once; also saved to {}):\n\n    {}\n",
            path.display(),
            new.secret
        );
    } else {
        tracing::info!(file = %path.display(), "created the first API key; it is in the key file (root only)");
    }
    Ok(())
}

/// The data dir holds the store, its key, the API key file and every sandbox's saved state:
/// it is created, or tightened, to 0700 root (threat model H3). What sandboxes and QEMUs need
/// from it is handed to them by the runtimes, never by opening the directory up.
fn private_data_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating data dir {}", dir.display()))?;
    let meta =
        std::fs::metadata(dir).with_context(|| format!("reading data dir {}", dir.display()))?;
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        anyhow::bail!(
            "data dir {} belongs to uid {}, not to the user running warren serve: choose \
             another --data-dir or chown it",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making data dir {} private (0700)", dir.display()))?;
    }
    Ok(())
}

/// Every connection, sandbox and helper process holds descriptors: take the hard limit
/// rather than the usual 1024, so the listener's connection cap, not EMFILE, is what refuses
/// clients first.
fn raise_nofile() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(error = %warren_runtime::chain(&e), "could not raise the open-file limit");
            }
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %warren_runtime::chain(&e), "could not read the open-file limit")
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down; sandboxes keep running and are reattached on the next start");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        runtimes: RuntimeArgs,
    }

    fn parse(args: &[&str]) -> Result<RuntimeArgs, clap::Error> {
        Flags::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .map(|f| f.runtimes)
    }

    #[test]
    fn runtime_settings_come_from_flags_with_the_documented_defaults() {
        let cfg = warren_host::HostConfig::new("/tmp/warren-flags".into());
        let d = parse(&[]).unwrap();
        assert_eq!(d.ns().prepared_max, 64);
        assert_eq!(
            d.ns().confinement,
            warren_runtime_ns::config::Confinement::Full
        );
        let vm = d.vm(&cfg);
        assert_eq!((vm.memory_mb, vm.warm_pool, vm.accel), (512, 2, None));
        assert_eq!(vm.kernel, Default::default());

        let set = parse(&[
            "--ns-prepared-max=0",
            "--ns-confinement=baseline",
            "--vm-memory-mb=1536",
            "--vm-warm-pool=0",
            "--vm-accel=tcg",
            "--vm-kernel=linux-image-x=1.2-3",
        ])
        .unwrap();
        assert_eq!(set.ns().prepared_max, 0);
        assert_eq!(
            set.ns().confinement,
            warren_runtime_ns::config::Confinement::Baseline
        );
        let vm = set.vm(&cfg);
        assert_eq!(vm.memory_mb, 1536);
        assert_eq!(vm.warm_pool, 0);
        assert_eq!(vm.accel, Some(warren_runtime_vm::Accel::Tcg));
        assert_eq!(
            (vm.kernel.package.as_str(), vm.kernel.version.as_str()),
            ("linux-image-x", "1.2-3")
        );
    }

    #[test]
    fn bad_runtime_settings_are_refused_with_the_reason() {
        for (args, says) in [
            (&["--ns-confinement=none"][..], "full or baseline"),
            (&["--vm-accel=hvf"][..], "kvm or tcg"),
            (&["--vm-kernel=nopin"][..], "<package>=<version>"),
            (&["--vm-memory-mb=64"][..], "128..=65536"),
        ] {
            let e = parse(args).expect_err("refused").to_string();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }
}

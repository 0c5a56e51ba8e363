//! `warren`: runs the server and drives it. Thin: parsing here, work in the modules.

#![forbid(unsafe_code)]

mod audit;
mod brokering;
mod client;
mod connect;
mod keys;
mod logging;
mod network;
mod networks;
mod persist;
mod sandbox;
mod serve;
mod shell;
mod template;
mod template_build;
mod top;
mod volumes;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

pub const DEFAULT_DATA_DIR: &str = "/var/lib/warren";
/// File in the data dir holding the key created on first start (mode 0600), for local CLI use.
pub const KEY_FILE: &str = "api-key";

#[derive(Parser)]
#[command(
    name = "warren",
    version,
    about = "Warren: sandboxes for AI agents, E2B-compatible"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum RuntimeKind {
    /// `vm` where KVM is truly usable (not PVM), else `ns`.
    Auto,
    /// Namespace containers (needs root).
    Ns,
    /// QEMU microVMs forked from template snapshots (KVM, or TCG emulation without it).
    Vm,
}

#[derive(clap::Args, Clone)]
pub struct ClientArgs {
    /// Server URL.
    #[arg(
        long,
        env = "WARREN_URL",
        default_value = "http://127.0.0.1:3000",
        global = true
    )]
    pub server: String,
    /// Data dir whose key file is used when WARREN_API_KEY is unset.
    #[arg(long, env = "WARREN_DATA_DIR", default_value = DEFAULT_DATA_DIR, global = true)]
    pub data_dir: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

// Parsed once per process and matched at once: `serve`'s many flags make it the largest
// variant by far, and boxing them would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Runs the API server and sandbox proxy.
    Serve {
        #[arg(long, default_value = "127.0.0.1:3000")]
        listen: SocketAddr,
        #[arg(long, default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        runtime: RuntimeKind,
        /// Live sandboxes allowed at once (more get 429).
        #[arg(long, default_value_t = 100)]
        max_sandboxes: usize,
        /// `GET /metrics` gets one series per running sandbox (CPU, memory, disk); off by
        /// default, as thousands of sandboxes make thousands of series.
        #[arg(long)]
        metrics_per_sandbox: bool,
        /// Webhooks may post to loopback, private and link-local addresses (off: a tenant's
        /// webhook must not reach this host's own services).
        #[arg(long)]
        webhooks_to_private_addresses: bool,
        /// The domain of this server's public names, as on E2B: the API at `api.<domain>`,
        /// sandbox ports at `<port>-<sandboxID>.<domain>`, served over HTTPS (below) and also
        /// routed by Host on --listen. Clients set `E2B_DOMAIN=<domain>`.
        #[arg(long)]
        domain: Option<String>,
        #[command(flatten)]
        tls: serve::TlsArgs,
        /// Longest lifetime, in seconds, of a signed file URL (`download_url`/`upload_url`):
        /// URLs without an expiration, or expiring later, are refused. Default: no limit.
        #[arg(long, value_name = "SECONDS")]
        signed_url_max_age: Option<std::num::NonZeroU64>,
        /// Largest upload of a template build's COPY files, in MiB (compressed, and again
        /// once unpacked).
        #[arg(long, value_name = "MIB", default_value_t = 4096)]
        max_upload_mb: u64,
        /// MiB of the data disk kept free for the store, pauses and snapshots: a pause,
        /// snapshot, fork, volume create, grow or snapshot, COPY upload or build step that
        /// would leave less is refused (507, with the numbers).
        #[arg(long, value_name = "MIB", default_value_t = 1024)]
        min_free_mb: u64,
        /// MiB a new volume gets when its create names no size (E2B's SDKs never do). A
        /// volume owns its whole size on the data disk from its create.
        #[arg(long, value_name = "MIB", default_value_t = 10240,
              value_parser = clap::value_parser!(u64).range(1..=1024 * 1024))]
        volume_size_mb: u64,
        /// Longest a template build may run, in seconds, all its steps together (each RUN step
        /// is also limited to an hour): past it the build fails and its sandbox is killed.
        #[arg(long, value_name = "SECONDS", default_value_t = 7200)]
        build_timeout_secs: u64,
        #[command(flatten)]
        registry: serve::RegistryArgs,
        #[command(flatten)]
        net: serve::NetArgs,
        #[command(flatten)]
        telemetry: serve::TelemetryArgs,
        #[command(flatten)]
        runtimes: serve::RuntimeArgs,
    },
    /// Creates, lists, inspects, runs commands or a shell in, pauses, resumes, snapshots,
    /// forks and kills sandboxes.
    Sandbox {
        #[command(subcommand)]
        command: sandbox::SandboxCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Private networks between sandboxes: create, list, info, delete, join, leave.
    Network {
        #[command(subcommand)]
        command: networks::NetworkCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// A live view of the sandboxes and what each uses (CPU, memory, disk), busiest first.
    Top(top::TopArgs),
    /// Volumes: create, list, info, delete, their files (ls, put, get, mkdir, rm) and
    /// snapshots.
    Volume {
        #[command(subcommand)]
        command: volumes::VolumeCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Lists and deletes snapshots (take them with `warren sandbox snapshot`).
    Snapshot {
        #[command(subcommand)]
        command: persist::SnapshotCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Lists the templates sandboxes can be created from.
    Template {
        #[command(subcommand)]
        command: template::TemplateCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Manages API keys in a data dir (works whether or not the server runs).
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
        #[arg(long, default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Looks after the server's store while the server is stopped.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
        #[arg(long, default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum StoreCommand {
    /// Seals every stored secret (tokens, env vars, volume tokens, secret values) again under
    /// a new key and replaces `warren.key`; refused while `warren serve` uses the data dir.
    RotateKey,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // The exporter, before logging starts: its layers are part of the subscriber.
    let otel = match &cli.command {
        Command::Serve { telemetry, .. } => match telemetry.exporter(rt.handle().clone()) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: {e:#}");
                return std::process::ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    logging::init(otel.as_deref());
    let result = rt.block_on(async move {
        match cli.command {
            Command::Serve {
                listen,
                data_dir,
                runtime,
                max_sandboxes,
                metrics_per_sandbox,
                webhooks_to_private_addresses,
                domain,
                tls,
                signed_url_max_age,
                max_upload_mb,
                min_free_mb,
                volume_size_mb,
                build_timeout_secs,
                registry,
                net,
                telemetry,
                runtimes,
            } => serve::run(
                serve::ServeArgs {
                    tls,
                    listen,
                    data_dir,
                    max_upload_mb,
                    min_free_mb,
                    volume_size_mb,
                    build_timeout_secs,
                    runtime,
                    max_sandboxes,
                    metrics_per_sandbox,
                    webhooks_to_private_addresses,
                    domain,
                    signed_url_max_age,
                    registry,
                    net,
                    telemetry,
                    runtimes,
                },
                otel,
            )
            .await
            .map(|()| 0),
            Command::Sandbox { command, client } => sandbox::run(command, client).await,
            Command::Template { command, client } => template::run(command, client).await,
            Command::Snapshot { command, client } => persist::run(command, client).await,
            Command::Network { command, client } => networks::run(command, client).await,
            Command::Volume { command, client } => volumes::run(command, client).await,
            Command::Top(args) => top::run(args).await.map(|()| 0),
            Command::Keys {
                command,
                data_dir,
                json,
            } => keys::run(command, &data_dir, json).await.map(|()| 0),
            Command::Store {
                command: StoreCommand::RotateKey,
                data_dir,
            } => {
                let _lock = serve::lock_data_dir(&data_dir)?;
                let db = data_dir.join("warren.db");
                let n =
                    tokio::task::spawn_blocking(move || warren_store::SqliteStore::rotate_key(&db))
                        .await??;
                println!(
                    "sealed {n} values under a new key in {}",
                    data_dir.join("warren.key").display()
                );
                Ok(0)
            }
        }
    });
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

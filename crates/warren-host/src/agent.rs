//! Talking to a new sandbox's agent: wait until it answers, then initialise it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use serde::Serialize;
use warren_proto::client::{self, AgentClient, CallOptions, EventStream};
use warren_proto::process::process_event::{data_event, Event};
use warren_proto::process::{ProcessConfig, ProcessEvent, StartRequest, StartResponse};
use warren_runtime::RuntimeError;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Init<'a> {
    env_vars: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    access_token: Option<&'a str>,
    default_user: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    default_workdir: Option<&'a str>,
    timestamp: String,
    /// Fresh random bytes (hex) for the guest kernel's random pool: sandboxes restored from
    /// one snapshot would otherwise start with the same random state.
    random_seed: String,
    /// The server's cap on signed file URLs' lifetime; always sent (0: none), so an agent
    /// restored from another sandbox's memory takes this server's policy, not the one it had.
    signed_url_max_age_secs: u64,
    /// Certificates (PEM) the sandbox's TLS clients must trust: the egress CA that brokers
    /// secrets (E2B's `caBundle`).
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_bundle: Option<&'a str>,
    /// Network file systems to mount (E2B's `volumeMounts`): the vm runtime's volumes.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    volume_mounts: &'a [InitVolumeMount],
}

/// A volume the agent mounts from the VM's NFS server: E2B's `{nfs_target, path}` plus
/// Warren's `read_only` and the server's `port` (MOUNT and NFS share it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InitVolumeMount {
    /// `<address>:<export path>`.
    pub nfs_target: String,
    pub path: String,
    pub read_only: bool,
    pub port: u16,
}

/// What a sandbox's agent is initialised with (see [`wait_and_init`]).
pub struct InitArgs<'a> {
    pub env_vars: &'a BTreeMap<String, String>,
    /// The token the agent requires from now on.
    pub access_token: Option<&'a str>,
    /// Authenticates the request to an agent that already has a token (restored from
    /// another sandbox's memory, or resumed).
    pub current_token: Option<&'a str>,
    /// The host's [`crate::HostConfig::signed_url_max_age`].
    pub signed_url_max_age: Option<NonZeroU64>,
    /// How long the agent may take to answer its health check.
    pub timeout: Duration,
    /// The template's default user and working directory.
    pub launch: &'a warren_template::Launch,
    /// See [`crate::HostConfig::ca_bundle`].
    pub ca_bundle: Option<&'a str>,
    /// Volumes the agent mounts over NFS (the vm runtime's; empty elsewhere).
    pub volume_mounts: &'a [InitVolumeMount],
}

/// The variables E2B gives every process of a template's service: `E2B_SANDBOX` and
/// `E2B_TEMPLATE_ID` (the service starts before any sandbox exists, so no sandbox id).
pub fn template_env(template: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("E2B_SANDBOX".to_string(), "true".to_string()),
        ("E2B_TEMPLATE_ID".to_string(), template.to_string()),
    ])
}

/// The sandbox-wide variables a sandbox's agent is initialised with: `spec`'s own, overridden
/// by E2B's `E2B_SANDBOX`, `E2B_SANDBOX_ID` and `E2B_TEMPLATE_ID`.
pub fn sandbox_env(spec: &warren_runtime::CreateSpec) -> BTreeMap<String, String> {
    let mut env = spec.env_vars.clone();
    env.extend(template_env(&spec.template));
    env.insert("E2B_SANDBOX_ID".into(), spec.id.to_string());
    env
}

/// Polls `GET /health` until the agent answers 204, then sends `POST /init` with `args`.
#[tracing::instrument(name = "agent.init", level = "info", skip_all)]
pub async fn wait_and_init(
    client: &reqwest::Client,
    agent: SocketAddr,
    args: &InitArgs<'_>,
) -> Result<(), RuntimeError> {
    wait_healthy(client, agent, args.timeout).await?;
    init(client, agent, args).await
}

/// Polls `GET /health` until the agent answers 204, for at most `timeout`.
pub async fn wait_healthy(
    client: &reqwest::Client,
    agent: SocketAddr,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + timeout;
    let health = format!("http://{agent}/health");
    loop {
        match client
            .get(&health)
            .timeout(Duration::from_millis(500))
            .send()
            .await
        {
            Ok(r) if r.status().as_u16() == 204 => return Ok(()),
            _ if Instant::now() > deadline => {
                return Err(RuntimeError::unavailable_now(format!(
                    "agent at {agent} did not become ready"
                )))
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// Sends `POST /init` with `args` to an agent that answers.
pub async fn init(
    client: &reqwest::Client,
    agent: SocketAddr,
    args: &InitArgs<'_>,
) -> Result<(), RuntimeError> {
    let InitArgs {
        env_vars,
        access_token,
        current_token,
        signed_url_max_age,
        timeout: _,
        launch,
        ca_bundle,
        volume_mounts,
    } = *args;
    let body = Init {
        env_vars,
        access_token,
        default_user: &launch.default_user,
        default_workdir: launch.default_workdir.as_deref(),
        timestamp: chrono::Utc::now().to_rfc3339(),
        random_seed: random_seed()?,
        signed_url_max_age_secs: signed_url_max_age.map_or(0, NonZeroU64::get),
        ca_bundle,
        volume_mounts,
    };
    let mut req = client.post(format!("http://{agent}/init")).json(&body);
    if let Some(token) = current_token {
        req = req.header("x-access-token", token);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| RuntimeError::unavailable("init agent", e))?;
    if resp.status().as_u16() != 204 {
        let status = resp.status();
        // The agent's error message (a volume that did not mount, say), kept short.
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("message")?.as_str().map(str::to_string))
            .unwrap_or_default();
        // The guest's words: one line, bounded.
        let message: String = message
            .chars()
            .take(500)
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        return Err(RuntimeError::unavailable_now(if message.is_empty() {
            format!("init agent: HTTP {status}")
        } else {
            format!("init agent: HTTP {status}: {message}")
        }));
    }
    Ok(())
}

/// 32 bytes from the host's kernel, as hex.
fn random_seed() -> Result<String, RuntimeError> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(RuntimeError::io("read /dev/urandom"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Largest first message of a Start stream we accept (the start event is a few dozen bytes).
const MAX_START_REPLY: usize = 64 * 1024;

/// Largest output event read from a command run to its end (the agent sends far smaller).
const MAX_EVENT: usize = 4 << 20;

/// Why a command could not be run through the agent to its end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("empty command")]
    EmptyCommand,
    #[error("talking to the agent")]
    Agent(#[from] client::Error),
    #[error("the agent did not start it (first event: {0})")]
    NotStarted(String),
    #[error("the agent ended the stream before the command's end")]
    NoEnd,
}

/// Starts the template's service through the agent's `process.Process/Start`, then waits
/// until its readiness check answers.
///
/// The process belongs to the agent, not to this request: we read the stream only until the
/// `start` event (the pid) and then close it, which leaves the process running, as a
/// background command of the SDKs does.
#[tracing::instrument(name = "agent.start_command", level = "info", skip_all)]
pub async fn run_start_command(
    client: &reqwest::Client,
    agent: SocketAddr,
    access_token: Option<&str>,
    cmd: &warren_template::StartCommand,
) -> Result<(), RuntimeError> {
    let stream = start(
        client,
        agent,
        access_token,
        cmd.user.as_deref(),
        &cmd.argv,
        cmd.cwd.as_deref(),
        &cmd.env,
    )
    .await
    .map_err(|e| RuntimeError::unavailable("template start command", e))?;
    drop(stream);
    wait_ready(client, agent, access_token, cmd).await
}

/// Runs `script` with `/bin/sh` as root in the sandbox and waits for its end; returns its
/// exit code. For the host's own housekeeping inside a sandbox (never tenant input).
pub async fn run_as_root(
    client: &reqwest::Client,
    agent: SocketAddr,
    access_token: Option<&str>,
    script: &str,
) -> Result<i64, RunError> {
    let argv = ["/bin/sh".to_string(), "-c".to_string(), script.to_string()];
    let ran = run(
        client,
        agent,
        access_token,
        Some("root"),
        &argv,
        Some("/"),
        0,
    )
    .await?;
    Ok(ran.exit_code)
}

/// What a command run to its end through the agent left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    pub exit_code: i64,
    /// Its stdout and stderr as they came, cut at the `keep` bytes asked for.
    pub output: Vec<u8>,
}

/// Runs `argv` through the agent as `user` (the agent's default when `None`) in `cwd` (the
/// user's home when `None`), waits for its end and keeps up to `keep` bytes of its output.
pub async fn run(
    client: &reqwest::Client,
    agent: SocketAddr,
    access_token: Option<&str>,
    user: Option<&str>,
    argv: &[String],
    cwd: Option<&str>,
    keep: usize,
) -> Result<Ran, RunError> {
    let mut stream = start(
        client,
        agent,
        access_token,
        user,
        argv,
        cwd,
        &BTreeMap::new(),
    )
    .await?;
    stream.set_max_message(MAX_EVENT);
    let mut output = Vec::new();
    while let Some(msg) = stream.next().await? {
        match msg.event.and_then(|e| e.event) {
            Some(Event::End(end)) => {
                return Ok(Ran {
                    exit_code: end.exit_code.into(),
                    output,
                })
            }
            Some(Event::Data(data)) => match data.output {
                Some(data_event::Output::Stdout(bytes) | data_event::Output::Stderr(bytes)) => {
                    let room = keep.saturating_sub(output.len());
                    output.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Some(data_event::Output::Pty(_)) | None => {}
            },
            Some(Event::Start(_) | Event::Keepalive(_)) | None => {}
        }
    }
    Err(RunError::NoEnd)
}

/// Starts `argv` through the agent's `process.Process/Start` as `user` (the agent's default
/// user when `None`); returns the open stream once the start event arrived.
async fn start(
    client: &reqwest::Client,
    agent: SocketAddr,
    access_token: Option<&str>,
    user: Option<&str>,
    argv: &[String],
    cwd: Option<&str>,
    env: &BTreeMap<String, String>,
) -> Result<EventStream<StartResponse>, RunError> {
    let Some((program, args)) = argv.split_first() else {
        return Err(RunError::EmptyCommand);
    };
    let request = StartRequest {
        process: Some(ProcessConfig {
            cmd: program.clone(),
            args: args.to_vec(),
            envs: env.clone().into_iter().collect(),
            cwd: cwd.map(str::to_string),
        }),
        stdin: Some(false),
        ..Default::default()
    };
    let mut agent = AgentClient::at(client.clone(), agent);
    if let Some(token) = access_token {
        agent = agent.with_access_token(token)?;
    }
    // The stream comes from inside the sandbox: a start event is tiny, never buffer whatever
    // length a misbehaving guest announces.
    let mut opts = CallOptions::new()
        .timeout(Duration::from_secs(60))
        .max_message(MAX_START_REPLY);
    if let Some(user) = user {
        opts = opts.user(user);
    }
    let mut stream = agent.process().start(&request, &opts).await?;
    // The first message is the start event; an end-of-stream error arrives as `Err`.
    match stream.next().await? {
        Some(StartResponse {
            event: Some(ProcessEvent {
                event: Some(Event::Start(_)),
            }),
        }) => Ok(stream),
        other => Err(RunError::NotStarted(format!("{other:?}"))),
    }
}

/// Waits until the service's readiness check passes: its HTTP check answers 200, or its
/// ready command exits 0 (tried again with a growing pause, up to a second), or at once
/// for a service with no check.
#[tracing::instrument(name = "agent.ready", level = "info", skip_all)]
pub async fn wait_ready(
    client: &reqwest::Client,
    agent: SocketAddr,
    access_token: Option<&str>,
    cmd: &warren_template::StartCommand,
) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + cmd.ready_timeout;
    let mut pause = Duration::from_millis(20);
    loop {
        let (ready, what) = match &cmd.ready {
            warren_template::Ready::Started => return Ok(()),
            warren_template::Ready::Http { port, path } => {
                let url = format!("http://{}:{port}{path}", agent.ip());
                let ok = matches!(
                    client.get(&url).timeout(Duration::from_secs(2)).send().await,
                    Ok(r) if r.status().is_success()
                );
                (ok, format!("template service on port {port}"))
            }
            warren_template::Ready::Command(argv) => {
                let ran = run(
                    client,
                    agent,
                    access_token,
                    cmd.user.as_deref(),
                    argv,
                    cmd.cwd.as_deref(),
                    0,
                )
                .await;
                (
                    matches!(ran, Ok(Ran { exit_code: 0, .. })),
                    format!(
                        "template ready command {:?}",
                        argv.last().map(String::as_str).unwrap_or("")
                    ),
                )
            }
        };
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(RuntimeError::unavailable_now(format!(
                "{what} did not become ready within {:?}",
                cmd.ready_timeout
            )));
        }
        // Not ready yet: an HTTP service opens its port only once it runs.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_runtime::Category;

    #[test]
    fn e2b_variables_override_the_sandbox_own() {
        let spec: warren_runtime::CreateSpec = serde_json::from_value(serde_json::json!({
            "id": warren_runtime::SandboxId::generate().unwrap().to_string(),
            "template": "base",
            "cpu_count": 1,
            "memory_mb": 512,
            "disk_mb": 1024,
            "allow_internet_access": true,
            "env_vars": {"A": "1", "E2B_SANDBOX": "false", "E2B_TEMPLATE_ID": "x"},
            "access_token": null,
        }))
        .unwrap();
        let env = sandbox_env(&spec);
        let want = BTreeMap::from([
            ("A".to_string(), "1".to_string()),
            ("E2B_SANDBOX".to_string(), "true".to_string()),
            ("E2B_SANDBOX_ID".to_string(), spec.id.to_string()),
            ("E2B_TEMPLATE_ID".to_string(), "base".to_string()),
        ]);
        assert_eq!(env, want);
        let service = template_env("base");
        assert!(!service.contains_key("E2B_SANDBOX_ID"));
        assert_eq!(service.len(), 2);
    }

    #[tokio::test]
    async fn an_agent_that_never_answers_is_unavailable() {
        // A port nothing listens on: every health probe is refused.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let launch = warren_template::Launch {
            default_user: "user".into(),
            default_workdir: None,
            start: None,
        };
        let args = InitArgs {
            env_vars: &BTreeMap::new(),
            access_token: None,
            current_token: None,
            signed_url_max_age: None,
            timeout: Duration::ZERO,
            launch: &launch,
            ca_bundle: None,
            volume_mounts: &[],
        };
        let e = wait_and_init(&client, addr, &args).await.unwrap_err();
        assert_eq!(e.category(), Category::Unavailable, "{e:?}");
        assert!(e.to_string().contains("did not become ready"), "{e}");
    }
}

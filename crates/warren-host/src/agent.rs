//! Talking to a new sandbox's agent: wait until it answers, then initialise it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use serde::Serialize;
use warren_runtime::RuntimeError;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Init<'a> {
    env_vars: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    access_token: Option<&'a str>,
    default_user: &'a str,
    timestamp: String,
    /// Fresh random bytes (hex) for the guest kernel's random pool: sandboxes restored from
    /// one snapshot would otherwise start with the same random state.
    random_seed: String,
    /// The server's cap on signed file URLs' lifetime; always sent (0: none), so an agent
    /// restored from another sandbox's memory takes this server's policy, not the one it had.
    signed_url_max_age_secs: u64,
}

/// Polls `GET /health` until the agent answers 204, then sends `POST /init`, which sets
/// `access_token`. `current_token` authenticates the request to an agent that already has
/// one (restored from another sandbox's memory, or resumed). `signed_url_max_age` is the
/// host's [`crate::HostConfig::signed_url_max_age`].
pub async fn wait_and_init(
    client: &reqwest::Client,
    agent: SocketAddr,
    env_vars: &BTreeMap<String, String>,
    access_token: Option<&str>,
    current_token: Option<&str>,
    signed_url_max_age: Option<NonZeroU64>,
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
            Ok(r) if r.status().as_u16() == 204 => break,
            _ if Instant::now() > deadline => {
                return Err(RuntimeError::Failed(format!(
                    "agent at {agent} did not become ready"
                )))
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
    let body = Init {
        env_vars,
        access_token,
        default_user: "user",
        timestamp: chrono::Utc::now().to_rfc3339(),
        random_seed: random_seed()?,
        signed_url_max_age_secs: signed_url_max_age.map_or(0, NonZeroU64::get),
    };
    let mut req = client.post(format!("http://{agent}/init")).json(&body);
    if let Some(token) = current_token {
        req = req.header("x-access-token", token);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| RuntimeError::Failed(format!("init agent: {e}")))?;
    if resp.status().as_u16() != 204 {
        return Err(RuntimeError::Failed(format!(
            "init agent: HTTP {}",
            resp.status()
        )));
    }
    Ok(())
}

/// 32 bytes from the host's kernel, as hex.
fn random_seed() -> Result<String, RuntimeError> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| RuntimeError::Failed(format!("read /dev/urandom: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Largest first message of a Start stream we accept (the start event is a few dozen bytes).
const MAX_START_REPLY: usize = 64 * 1024;

/// Largest output event read from a command run to its end (the agent sends far smaller).
const MAX_EVENT: usize = 4 << 20;

/// Starts the template's service through the agent's `process.Process/Start` (Connect
/// protocol, JSON), then waits until its readiness check answers.
///
/// The process belongs to the agent, not to this request: we read the stream only until the
/// `start` event (the pid) and then close it, which leaves the process running, as a
/// background command of the SDKs does.
pub async fn run_start_command(
    client: &reqwest::Client,
    agent: SocketAddr,
    access_token: Option<&str>,
    cmd: &warren_template::StartCommand,
) -> Result<(), RuntimeError> {
    let fail = |what: String| RuntimeError::Failed(format!("template start command: {what}"));
    let (resp, _) = start(client, agent, access_token, None, &cmd.argv, Some(&cmd.cwd))
        .await
        .map_err(fail)?;
    drop(resp);
    wait_ready(client, agent, cmd).await
}

/// Runs `script` with `/bin/sh` as root in the sandbox and waits for its end; returns its
/// exit code. For the host's own housekeeping inside a sandbox (never tenant input).
pub async fn run_as_root(
    client: &reqwest::Client,
    agent: SocketAddr,
    access_token: Option<&str>,
    script: &str,
) -> Result<i64, String> {
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
) -> Result<Ran, String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let (mut resp, mut buf) = start(client, agent, access_token, user, argv, cwd).await?;
    let mut output = Vec::new();
    loop {
        while buf.len() >= 5 {
            let n = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if n > MAX_EVENT {
                return Err(format!("event of {n} bytes is too large"));
            }
            if buf.len() < 5 + n {
                break;
            }
            let message: serde_json::Value =
                serde_json::from_slice(&buf[5..5 + n]).map_err(|e| format!("bad reply: {e}"))?;
            let event = &message["event"];
            if let Some(end) = event.get("end") {
                return Ok(Ran {
                    exit_code: end.get("exitCode").and_then(|c| c.as_i64()).unwrap_or(0),
                    output,
                });
            }
            for stream in ["stdout", "stderr"] {
                if let Some(data) = event["data"][stream].as_str() {
                    let bytes = b64
                        .decode(data)
                        .map_err(|e| format!("bad {stream} data: {e}"))?;
                    let room = keep.saturating_sub(output.len());
                    output.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
            }
            buf.drain(..5 + n);
        }
        match resp.chunk().await.map_err(|e| e.to_string())? {
            Some(chunk) => buf.extend_from_slice(&chunk),
            None => return Err("the agent closed the stream before the end".into()),
        }
    }
}

/// Starts `argv` through the agent's `process.Process/Start` (Connect protocol, JSON) as
/// `user` (the agent's default user when `None`); returns the open stream once the start
/// event arrived, with what was read after it.
async fn start(
    client: &reqwest::Client,
    agent: SocketAddr,
    access_token: Option<&str>,
    user: Option<&str>,
    argv: &[String],
    cwd: Option<&str>,
) -> Result<(reqwest::Response, Vec<u8>), String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("empty command".into());
    };
    let mut request = serde_json::json!({
        "process": { "cmd": program, "args": args, "envs": {} },
        "stdin": false,
    });
    if let Some(cwd) = cwd {
        request["process"]["cwd"] = cwd.into();
    }
    let payload = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    let len = u32::try_from(payload.len()).map_err(|_| "request too large".to_string())?;
    // One Connect envelope: flags byte (0 = data), big-endian length, the JSON message.
    let mut body = Vec::with_capacity(payload.len() + 5);
    body.push(0u8);
    body.extend_from_slice(&len.to_be_bytes());
    body.extend_from_slice(&payload);
    let mut req = client
        .post(format!("http://{agent}/process.Process/Start"))
        .header("content-type", "application/connect+json")
        .timeout(Duration::from_secs(60))
        .body(body);
    if let Some(token) = access_token {
        req = req.header("x-access-token", token);
    }
    if let Some(user) = user {
        use base64::Engine;
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
        req = req.header("authorization", format!("Basic {basic}"));
    }
    let mut resp = req.send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("agent answered HTTP {}", resp.status()));
    }
    // Read until the first whole envelope: the start event, or an end-of-stream error.
    let mut buf: Vec<u8> = Vec::new();
    let (flags, message) = loop {
        if buf.len() >= 5 {
            let n = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            // The stream comes from inside the sandbox: a start event is tiny, never buffer
            // whatever length a misbehaving guest announces.
            if n > MAX_START_REPLY {
                return Err(format!("start reply of {n} bytes is too large"));
            }
            if buf.len() >= 5 + n {
                let first = (buf[0], buf[5..5 + n].to_vec());
                buf.drain(..5 + n);
                break first;
            }
        }
        match resp.chunk().await.map_err(|e| e.to_string())? {
            Some(chunk) => buf.extend_from_slice(&chunk),
            None => return Err("the agent closed the stream before the start".into()),
        }
    };
    let message: serde_json::Value =
        serde_json::from_slice(&message).map_err(|e| format!("bad start reply: {e}"))?;
    if flags & 0x02 != 0 || message.pointer("/event/start/pid").is_none() {
        return Err(format!("the agent did not start it: {message}"));
    }
    Ok((resp, buf))
}

/// Polls `GET http://<sandbox>:<ready_port><ready_path>` until it answers 200.
pub async fn wait_ready(
    client: &reqwest::Client,
    agent: SocketAddr,
    cmd: &warren_template::StartCommand,
) -> Result<(), RuntimeError> {
    let url = format!("http://{}:{}{}", agent.ip(), cmd.ready_port, cmd.ready_path);
    let deadline = Instant::now() + cmd.ready_timeout;
    loop {
        match client
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => return Ok(()),
            _ if Instant::now() > deadline => {
                return Err(RuntimeError::Failed(format!(
                    "template service on port {} did not become ready within {:?}",
                    cmd.ready_port, cmd.ready_timeout
                )))
            }
            // Not listening yet: the server opens its port only once its kernel runs.
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

//! `warren sandbox create|list|info|exec|shell|kill|pause|resume|snapshot|fork|network`.

use std::io::{IsTerminal, Write};

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Value};
use warren_proto::client::{self, CallOptions, EventStream};
use warren_proto::process::process_event::data_event::Output;
use warren_proto::process::process_event::{DataEvent, Event};
use warren_proto::process::{ProcessConfig, StartRequest, StartResponse};

use crate::client::Client;
use crate::network::{self, EgressArgs};
use crate::{connect, persist, shell, ClientArgs};

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// Creates a sandbox and prints its id.
    Create(CreateArgs),
    List {
        /// KEY=VALUE metadata filter (repeatable).
        #[arg(long = "metadata", value_parser = key_value)]
        metadata: Vec<(String, String)>,
    },
    Info {
        id: String,
    },
    /// Runs a command in a login shell (`/bin/bash -l -c`) and exits with its status. One
    /// argument is a shell command line (`'ls | wc -l'`); several are one argv, run exactly as
    /// given (`-- sh -c 'uname -a'`).
    Exec {
        id: String,
        #[arg(long)]
        user: Option<String>,
        #[arg(required = true, trailing_var_arg = true)]
        command: Vec<String>,
    },
    /// Opens an interactive terminal (`/bin/bash -i -l` on a PTY) in the sandbox.
    Shell {
        id: String,
        #[arg(long)]
        user: Option<String>,
    },
    Kill {
        id: String,
    },
    /// Pauses a sandbox; `resume` (or any SDK connect) brings it back.
    Pause {
        id: String,
        /// Keep memory and running processes (the default when the runtime can).
        #[arg(long, conflicts_with = "filesystem")]
        full: bool,
        /// Keep only the filesystem; processes start afresh on resume.
        #[arg(long)]
        filesystem: bool,
    },
    /// Resumes a paused sandbox (a running one just gets its timeout extended).
    Resume {
        id: String,
        /// Seconds it lives from now.
        #[arg(long)]
        timeout: Option<i64>,
    },
    /// Snapshots a running sandbox (it keeps running) and prints the snapshot id, which
    /// works as a template: `warren sandbox create --template <id>`.
    Snapshot {
        id: String,
        /// A name; reusing one replaces the older snapshot.
        #[arg(long)]
        name: Option<String>,
        /// Ask for memory in the snapshot.
        #[arg(long, conflicts_with = "filesystem")]
        full: bool,
        /// Files only.
        #[arg(long)]
        filesystem: bool,
    },
    /// Replaces a sandbox's egress policy (no option: everything allowed again).
    Network {
        id: String,
        #[command(flatten)]
        egress: EgressArgs,
    },
    /// Prints a sandbox's flow log: its egress policy's recent decisions about DNS queries
    /// and TCP connections, oldest first.
    Flows {
        id: String,
    },
    /// Prints a sandbox's audit trail: processes (through the API and inside), their output,
    /// files changed through the API, network decisions and lifecycle changes, oldest first.
    Audit(crate::audit::AuditArgs),
    /// Creates COUNT copies of a running sandbox and prints their ids.
    Fork {
        id: String,
        #[arg(long)]
        count: Option<i64>,
        /// Seconds the copies live.
        #[arg(long)]
        timeout: Option<i64>,
    },
}

// The options of `warren sandbox create` (no doc comment: clap would take it for the
// subcommand's help, which the variant's gives).
#[derive(Args)]
pub struct CreateArgs {
    #[arg(long, default_value = "base")]
    template: String,
    /// Seconds until it is killed.
    #[arg(long)]
    timeout: Option<i64>,
    /// KEY=VALUE metadata (repeatable).
    #[arg(long = "metadata", value_parser = key_value)]
    metadata: Vec<(String, String)>,
    /// KEY=VALUE environment variables (repeatable).
    #[arg(long = "env", value_parser = key_value)]
    env: Vec<(String, String)>,
    /// Pause instead of kill at the end of its timeout.
    #[arg(long)]
    auto_pause: bool,
    /// With --auto-pause: keep only the filesystem.
    #[arg(long, requires = "auto_pause")]
    auto_pause_filesystem: bool,
    /// With --auto-pause: traffic through the proxy resumes it.
    #[arg(long, requires = "auto_pause")]
    auto_resume: bool,
    #[command(flatten)]
    egress: EgressArgs,
    /// A private network to join, as NAME or NAME:ALIAS (repeatable).
    #[arg(long = "network", value_name = "NAME[:ALIAS]")]
    networks: Vec<String>,
    /// A volume to mount, as NAME:/PATH or NAME:/PATH:ro (repeatable).
    #[arg(long = "volume", value_name = "NAME:/PATH[:ro]", value_parser = volume_mount)]
    volumes: Vec<Value>,
}

/// `NAME:/PATH[:ro]` as a `volumeMounts` entry.
fn volume_mount(s: &str) -> Result<Value, String> {
    let (name, rest) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected NAME:/PATH[:ro]"))?;
    let (path, ro) = match rest.strip_suffix(":ro") {
        Some(p) => (p, true),
        None => (rest, false),
    };
    if name.is_empty() || !path.starts_with('/') {
        return Err(format!("{s:?}: expected NAME:/PATH[:ro]"));
    }
    let mut m = json!({"name": name, "path": path});
    if ro {
        m["readOnly"] = true.into();
    }
    Ok(m)
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn map(pairs: Vec<(String, String)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect(),
    )
}

/// A spinner on stderr while a slow call runs; none when stderr is not a terminal.
fn spinner(message: &str) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.set_message(message.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    Some(bar)
}

pub async fn run(cmd: SandboxCommand, args: ClientArgs) -> anyhow::Result<u8> {
    let client = Client::new(&args)?;
    match cmd {
        SandboxCommand::Create(create_args) => create(&client, &args, create_args).await?,
        SandboxCommand::List { metadata } => list(&client, &args, &metadata).await?,
        SandboxCommand::Info { id } => info(&client, &args, &id).await?,
        SandboxCommand::Exec { id, user, command } => {
            return exec(&client, &id, user, &shell_line(&command)?).await
        }
        SandboxCommand::Shell { id, user } => return shell::run(&client, &id, user).await,
        SandboxCommand::Kill { id } => {
            client
                .api(Method::DELETE, &format!("/sandboxes/{id}"), None)
                .await?;
            if !args.json {
                println!("killed {id}");
            }
        }
        SandboxCommand::Pause {
            id,
            full,
            filesystem,
        } => persist::pause(&client, &args, &id, persist::memory_flag(full, filesystem)).await?,
        SandboxCommand::Resume { id, timeout } => {
            persist::resume(&client, &args, &id, timeout).await?
        }
        SandboxCommand::Snapshot {
            id,
            name,
            full,
            filesystem,
        } => {
            let memory = persist::memory_flag(full, filesystem);
            persist::snapshot(&client, &args, &id, name, memory).await?
        }
        SandboxCommand::Network { id, egress } => {
            network::update(&client, &args, &id, &egress).await?
        }
        SandboxCommand::Flows { id } => network::flows(&client, &args, &id).await?,
        SandboxCommand::Audit(a) => crate::audit::run(&client, &args, a).await?,
        SandboxCommand::Fork { id, count, timeout } => {
            return persist::fork(&client, &args, &id, count, timeout).await
        }
    }
    Ok(0)
}

/// The body of `POST /v2/sandboxes` for `warren sandbox create`.
fn create_body(c: CreateArgs) -> Value {
    let mut body = json!({
        "templateID": c.template,
        "metadata": map(c.metadata),
        "envVars": map(c.env),
    });
    if let Some(t) = c.timeout {
        body["timeout"] = t.into();
    }
    if c.auto_pause {
        body["autoPause"] = true.into();
        if c.auto_pause_filesystem {
            body["autoPauseMemory"] = false.into();
        }
        if c.auto_resume {
            body["autoResume"] = json!({"enabled": true});
        }
    }
    c.egress.add_to_create(&mut body);
    if !c.networks.is_empty() {
        body["networks"] = c.networks.clone().into();
    }
    if !c.volumes.is_empty() {
        body["volumeMounts"] = Value::Array(c.volumes);
    }
    body
}

/// `warren sandbox create`: prints the new sandbox's id (or its record with `--json`).
async fn create(client: &Client, args: &ClientArgs, c: CreateArgs) -> anyhow::Result<()> {
    let message = format!("creating a sandbox from template {}", c.template);
    let body = create_body(c);
    let spinner = spinner(&message);
    let created = client.api(Method::POST, "/v2/sandboxes", Some(body)).await;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let v: Value = created?.json().await?;
    if args.json {
        println!("{v}");
    } else {
        println!("{}", v["sandboxID"].as_str().unwrap_or_default());
    }
    Ok(())
}

/// `warren sandbox list`: one line per sandbox (or the list with `--json`).
async fn list(
    client: &Client,
    args: &ClientArgs,
    metadata: &[(String, String)],
) -> anyhow::Result<()> {
    let mut path = "/v2/sandboxes".to_string();
    if !metadata.is_empty() {
        let q: Vec<String> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let encoded: String = q.join("&").bytes().map(|b| format!("%{b:02X}")).collect();
        path.push_str(&format!("?metadata={encoded}"));
    }
    let items: Vec<Value> = client.api(Method::GET, &path, None).await?.json().await?;
    if args.json {
        println!("{}", Value::Array(items));
        return Ok(());
    }
    println!(
        "{:<24} {:<12} {:<9} {:<26} {:<26} METADATA",
        "ID", "TEMPLATE", "STATE", "STARTED", "ENDS"
    );
    for s in items {
        let meta = s["metadata"].as_object().map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        });
        println!(
            "{:<24} {:<12} {:<9} {:<26} {:<26} {}",
            s["sandboxID"].as_str().unwrap_or_default(),
            s["templateID"].as_str().unwrap_or_default(),
            s["state"].as_str().unwrap_or_default(),
            s["startedAt"].as_str().unwrap_or_default(),
            s["endAt"].as_str().unwrap_or_default(),
            meta.unwrap_or_default()
        );
    }
    Ok(())
}

/// `warren sandbox info`: the sandbox's record, without its access token.
async fn info(client: &Client, args: &ClientArgs, id: &str) -> anyhow::Result<()> {
    let mut v: Value = client
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await?
        .json()
        .await?;
    // The access token is a secret: not printed by default.
    if let Some(o) = v.as_object_mut() {
        o.remove("envdAccessToken");
    }
    if args.json {
        println!("{v}");
    } else if let Some(o) = v.as_object() {
        for (k, val) in o {
            println!(
                "{k:<22} {}",
                val.as_str().map_or_else(|| val.to_string(), str::to_string)
            );
        }
    }
    Ok(())
}

/// The sandbox's agent access token (`envdAccessToken`), needed for every call through the proxy.
pub async fn agent_token(client: &Client, id: &str) -> anyhow::Result<String> {
    let detail: Value = client
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await?
        .json()
        .await?;
    Ok(detail["envdAccessToken"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// Starts a process (`process.Process/Start`) through the proxy and returns its event stream
/// once the agent accepted the call.
pub async fn start_process(
    client: &Client,
    id: &str,
    token: &str,
    user: Option<&str>,
    request: &StartRequest,
) -> anyhow::Result<EventStream<StartResponse>> {
    // Keepalive events while idle keep proxies from closing a quiet stream.
    let mut opts = CallOptions::new().keepalive_ping_interval(Duration::from_secs(50));
    if let Some(u) = user {
        opts = opts.user(u);
    }
    Ok(client
        .agent(id, token)?
        .process()
        .start(request, &opts)
        .await?)
}

/// The line `bash -c` runs for `exec`'s arguments: a single argument as the shell command line
/// it is, several quoted word by word so the shell hands the program exactly that argv.
fn shell_line(command: &[String]) -> anyhow::Result<String> {
    match command {
        [line] => Ok(line.clone()),
        words => shlex::try_join(words.iter().map(String::as_str))
            .context("an argument holds a NUL byte, which no argv can carry"),
    }
}

/// The `Start` request of `exec`: `command` in a login shell, stdin closed.
fn exec_request(command: &str) -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), command.into()],
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    }
}

/// Streams a command's output through the proxy and returns its exit status.
async fn exec(
    client: &Client,
    id: &str,
    user: Option<String>,
    command: &str,
) -> anyhow::Result<u8> {
    let token = agent_token(client, id).await?;
    let mut stream =
        start_process(client, id, &token, user.as_deref(), &exec_request(command)).await?;
    let mut code: u8 = 0;
    loop {
        let msg = match stream.next().await {
            Ok(Some(msg)) => msg,
            Ok(None) => return Ok(code),
            Err(client::Error::Truncated { .. }) => bail!("the sandbox closed the stream early"),
            Err(e) => return Err(e.into()),
        };
        match connect::event(msg) {
            Some(Event::Data(DataEvent {
                output: Some(Output::Stdout(bytes)),
            })) => {
                let mut out = std::io::stdout();
                out.write_all(&bytes)?;
                out.flush()?;
            }
            Some(Event::Data(DataEvent {
                output: Some(Output::Stderr(bytes)),
            })) => std::io::stderr().write_all(&bytes)?,
            Some(Event::End(end)) => code = connect::exit_code(&end),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{create_body, exec_request, shell_line, CreateArgs, SandboxCommand};
    use serde_json::json;

    fn create_args(flags: &[&str]) -> CreateArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            cmd: SandboxCommand,
        }
        let argv = ["warren", "create"].iter().chain(flags);
        match <Cli as clap::Parser>::try_parse_from(argv).unwrap().cmd {
            SandboxCommand::Create(c) => c,
            _ => unreachable!("parsed a create"),
        }
    }

    #[test]
    fn create_sends_the_template_metadata_env_and_pause_settings() {
        assert_eq!(
            create_body(create_args(&[])),
            json!({"templateID": "base", "metadata": {}, "envVars": {}})
        );
        let all = create_args(&[
            "--template=py",
            "--timeout=60",
            "--metadata=a=1",
            "--env=E=x",
            "--auto-pause",
            "--auto-pause-filesystem",
            "--auto-resume",
            "--deny-out=198.51.100.0/24",
        ]);
        assert_eq!(
            create_body(all),
            json!({
                "templateID": "py", "metadata": {"a": "1"}, "envVars": {"E": "x"},
                "timeout": 60, "autoPause": true, "autoPauseMemory": false,
                "autoResume": {"enabled": true},
                "network": {"allowOut": [], "denyOut": ["198.51.100.0/24"]},
            })
        );
        assert!(
            create_args(&["--auto-pause"]).auto_pause,
            "--auto-pause alone is a plain pause"
        );
    }

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_argument_is_a_command_line() {
        assert_eq!(shell_line(&words(&["ls | wc -l"])).unwrap(), "ls | wc -l");
    }

    #[test]
    fn exec_runs_a_login_shell_without_stdin() {
        let v = serde_json::to_value(exec_request("ls | wc -l")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "ls | wc -l"]},
                "stdin": false
            })
        );
    }

    #[test]
    fn several_arguments_are_quoted_word_by_word() {
        let line = shell_line(&words(&["sh", "-c", "uname -a", "it's"])).unwrap();
        assert_eq!(line, r#"sh -c 'uname -a' "it's""#);
    }
}

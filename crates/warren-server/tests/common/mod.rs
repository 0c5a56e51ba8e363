//! Test fixtures: a runtime whose sandboxes are real `warren-agent` processes on loopback
//! ports (so proxy tests talk to a real agent), and a real server on a real socket with the
//! SQLite store.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use warren_control::{Config, Control};
use warren_runtime::egress::EgressPolicy;
use warren_runtime::{
    Capabilities, CreateSpec, Exit, PauseMode, ResumeKind, RuntimeError, RuntimeSandbox,
    SandboxRuntime, SnapshotInfo,
};
use warren_server::ServerConfig;
use warren_store::SqliteStore;

pub const API_KEY: &str = "test-api-key-0123456789";

/// `target/<profile>/warren-agent`, built on demand when a lone `cargo test -p warren-server`
/// has not built it.
pub fn agent_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .to_path_buf();
    let bin = profile_dir.join("warren-agent");
    static BUILD: Mutex<()> = Mutex::new(());
    let _g = BUILD.lock().unwrap();
    if !bin.exists() {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "-p", "warren-agent"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("cargo build").success(),
            "building warren-agent"
        );
    }
    bin
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_healthy(port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            if out.starts_with("HTTP/1.1 204") {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Each sandbox is a `warren-agent` child process on its own loopback port. With
/// `persistence()`, a pause stops the process (SIGSTOP) and a resume continues it (SIGCONT),
/// and snapshots are recorded keys (the agent has no filesystem of its own to save): enough
/// for the HTTP mapping and proxy behaviour, while the real runtime is tested end to end.
#[derive(Default)]
pub struct AgentRuntime {
    children: Mutex<HashMap<String, Child>>,
    caps: Mutex<Capabilities>,
    agents: Mutex<HashMap<String, SocketAddr>>,
    pub snapshots: Mutex<Vec<String>>,
    /// Every egress policy the runtime was given (create and live changes), in order.
    pub egress: Mutex<Vec<(String, EgressPolicy)>>,
    /// The volumes of every create, by sandbox id, in order.
    pub volumes: Mutex<Vec<(String, Vec<warren_runtime::VolumeMount>)>>,
}

fn signal(child: &Child, sig: &str) -> Result<(), RuntimeError> {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .map_err(|e| RuntimeError::Failed(e.to_string()))?
        .success();
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::Failed(format!("kill {sig} failed")))
    }
}

impl AgentRuntime {
    /// A runtime that takes egress policies by address and header rules (and records them).
    pub fn with_egress() -> AgentRuntime {
        let rt = AgentRuntime::persistence();
        rt.caps.lock().unwrap().egress_addresses = true;
        rt.caps.lock().unwrap().egress_rules = true;
        rt
    }

    /// A runtime that takes volume mounts (and records them).
    pub fn with_volumes() -> AgentRuntime {
        let rt = AgentRuntime::persistence();
        rt.caps.lock().unwrap().volumes = true;
        rt
    }

    pub fn persistence() -> AgentRuntime {
        let rt = AgentRuntime::default();
        *rt.caps.lock().unwrap() = Capabilities {
            pause_memory: true,
            pause_filesystem: false,
            snapshot: true,
            snapshot_memory: false,
            snapshot_filesystem: true,
            ..Capabilities::default()
        };
        rt
    }
}

#[async_trait]
impl SandboxRuntime for AgentRuntime {
    fn name(&self) -> &'static str {
        "test-agent"
    }
    fn capabilities(&self) -> Capabilities {
        *self.caps.lock().unwrap()
    }
    async fn create(&self, spec: CreateSpec) -> Result<RuntimeSandbox, RuntimeError> {
        if spec.template != "base" {
            return Err(RuntimeError::UnknownTemplate(spec.template));
        }
        self.egress
            .lock()
            .unwrap()
            .push((spec.id.to_string(), spec.egress_policy()));
        self.volumes
            .lock()
            .unwrap()
            .push((spec.id.to_string(), spec.volumes.clone()));
        let port = free_port();
        let mut cmd = Command::new(agent_bin());
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .env("WARREN_LOG", "warn")
            .stdout(Stdio::null());
        if let Some(t) = &spec.access_token {
            cmd.arg("--access-token").arg(t);
        }
        let child = cmd
            .spawn()
            .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        self.children
            .lock()
            .unwrap()
            .insert(spec.id.to_string(), child);
        let healthy = tokio::task::spawn_blocking(move || wait_healthy(port))
            .await
            .unwrap_or(false);
        if !healthy {
            return Err(RuntimeError::Failed("agent did not start".into()));
        }
        if !spec.env_vars.is_empty() {
            let client = reqwest::Client::new();
            let mut req = client
                .post(format!("http://127.0.0.1:{port}/init"))
                .json(&serde_json::json!({"envVars": spec.env_vars}));
            if let Some(t) = &spec.access_token {
                req = req.header("X-Access-Token", t);
            }
            req.send()
                .await
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        }
        if let Some(key) = &spec.from_snapshot {
            if !self.snapshots.lock().unwrap().contains(key) {
                return Err(RuntimeError::NotFound(key.clone()));
            }
        }
        let agent = SocketAddr::from(([127, 0, 0, 1], port));
        self.agents
            .lock()
            .unwrap()
            .insert(spec.id.to_string(), agent);
        Ok(RuntimeSandbox {
            id: spec.id.to_string(),
            agent,
            record: serde_json::json!({"port": port}),
        })
    }
    async fn set_egress(
        &self,
        id: &str,
        policy: &EgressPolicy,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        if !self.caps.lock().unwrap().egress_addresses {
            return Err(RuntimeError::Unsupported("no egress policies".into()));
        }
        let agent = *self
            .agents
            .lock()
            .unwrap()
            .get(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        self.egress
            .lock()
            .unwrap()
            .push((id.to_string(), policy.clone()));
        Ok(RuntimeSandbox {
            id: id.into(),
            agent,
            record: serde_json::json!({"port": agent.port(), "egress": policy}),
        })
    }
    async fn pause(&self, id: &str, _mode: PauseMode) -> Result<RuntimeSandbox, RuntimeError> {
        let children = self.children.lock().unwrap();
        let child = children
            .get(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        signal(child, "-STOP")?;
        let agent = self.agents.lock().unwrap()[id];
        Ok(RuntimeSandbox {
            id: id.into(),
            agent,
            record: serde_json::json!({"port": agent.port(), "stopped": true}),
        })
    }
    async fn resume(&self, spec: CreateSpec) -> Result<(RuntimeSandbox, ResumeKind), RuntimeError> {
        let children = self.children.lock().unwrap();
        let child = children
            .get(spec.id.as_str())
            .ok_or_else(|| RuntimeError::NotFound(spec.id.to_string()))?;
        signal(child, "-CONT")?;
        let agent = self.agents.lock().unwrap()[spec.id.as_str()];
        let rt = RuntimeSandbox {
            id: spec.id.to_string(),
            agent,
            record: serde_json::json!({"port": agent.port()}),
        };
        Ok((rt, ResumeKind::Memory))
    }
    async fn snapshot(
        &self,
        id: &str,
        key: &str,
        memory: bool,
    ) -> Result<SnapshotInfo, RuntimeError> {
        if memory {
            return Err(RuntimeError::Unsupported("files only".into()));
        }
        if !self.children.lock().unwrap().contains_key(id) {
            return Err(RuntimeError::NotFound(id.into()));
        }
        self.snapshots.lock().unwrap().push(key.into());
        Ok(SnapshotInfo {
            memory: false,
            bytes: 0,
        })
    }
    async fn delete_snapshot(&self, key: &str) -> Result<(), RuntimeError> {
        let mut snaps = self.snapshots.lock().unwrap();
        let before = snaps.len();
        snaps.retain(|k| k != key);
        if snaps.len() == before {
            return Err(RuntimeError::NotFound(key.into()));
        }
        Ok(())
    }
    async fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        let mut child = self
            .children
            .lock()
            .unwrap()
            .remove(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        // A stopped process dies of SIGKILL too.
        let _ = child.kill();
        let _ = child.wait();
        Ok(())
    }
    async fn status(&self, id: &str) -> Result<Option<Exit>, RuntimeError> {
        let mut children = self.children.lock().unwrap();
        let child = children
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        Ok(child.try_wait().ok().flatten().map(|s| Exit {
            reason: s.to_string(),
        }))
    }
    async fn reattach(
        &self,
        records: Vec<RuntimeSandbox>,
    ) -> Vec<(String, Result<RuntimeSandbox, RuntimeError>)> {
        // Sandboxes of this runtime are children of the test process: they are kept when the
        // same runtime object serves the restarted control plane.
        let children = self.children.lock().unwrap();
        records
            .into_iter()
            .map(|r| {
                let res = if children.contains_key(&r.id) {
                    Ok(r.clone())
                } else {
                    Err(RuntimeError::NotFound(r.id.clone()))
                };
                (r.id, res)
            })
            .collect()
    }
}

impl Drop for AgentRuntime {
    fn drop(&mut self) {
        for (_, mut c) in self.children.lock().unwrap().drain() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct TestServer {
    pub base: String,
    pub addr: SocketAddr,
    pub control: Control,
    pub runtime: Arc<AgentRuntime>,
    pub dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(Config::default()).await
    }

    pub async fn start_with(config: Config) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Arc::new(AgentRuntime::default());
        Self::start_on(dir, runtime, config).await
    }

    /// Starts a server over an existing data dir and runtime (restart tests).
    pub async fn start_on(
        dir: tempfile::TempDir,
        runtime: Arc<AgentRuntime>,
        config: Config,
    ) -> TestServer {
        Self::start_full(
            dir,
            runtime,
            config,
            ServerConfig::default(),
            warren_server::ListenerLimits::default(),
        )
        .await
    }

    /// Starts a server with its HTTP-side settings (domain, listener limits) too.
    pub async fn start_full(
        dir: tempfile::TempDir,
        runtime: Arc<AgentRuntime>,
        config: Config,
        server: ServerConfig,
        limits: warren_server::ListenerLimits,
    ) -> TestServer {
        Self::start_with_tls(dir, runtime, config, server, limits, None).await
    }

    /// A server whose template builds go to `builder`.
    pub async fn start_building(builder: Arc<dyn warren_control::TemplateBuilder>) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Arc::new(AgentRuntime::default());
        Self::start_wired(
            dir,
            runtime,
            Config::default(),
            ServerConfig::default(),
            warren_server::ListenerLimits::default(),
            None,
            Some(builder),
        )
        .await
    }

    /// [`TestServer::start_full`] with a TLS listener beside the plain one.
    pub async fn start_with_tls(
        dir: tempfile::TempDir,
        runtime: Arc<AgentRuntime>,
        config: Config,
        server: ServerConfig,
        limits: warren_server::ListenerLimits,
        tls: Option<warren_server::TlsListener>,
    ) -> TestServer {
        Self::start_wired(dir, runtime, config, server, limits, tls, None).await
    }

    /// The control plane wired as `warren serve` wires it (the proxy reads guests, webhooks
    /// post over HTTP, `server.volumes` backs the volume API), with `builder` if given.
    async fn start_wired(
        dir: tempfile::TempDir,
        runtime: Arc<AgentRuntime>,
        config: Config,
        server: ServerConfig,
        limits: warren_server::ListenerLimits,
        tls: Option<warren_server::TlsListener>,
        builder: Option<Arc<dyn warren_control::TemplateBuilder>>,
    ) -> TestServer {
        let store = Arc::new(SqliteStore::open(&dir.path().join("warren.db")).unwrap());
        let proxy = Arc::new(warren_server::proxy::Proxy::new(server.domain.clone()));
        let mut wiring = Control::builder(store, runtime.clone(), config)
            .guest_metrics(proxy.clone())
            .webhooks(Arc::new(warren_adapters::HttpWebhookSender {
                allow_private: false,
                encode: warren_server::event_payload,
            }));
        if let Some(host) = &server.volumes {
            wiring = wiring.volumes(Arc::new(warren_adapters::HostDisks(host.clone())));
        }
        if let Some(builder) = builder {
            wiring = wiring.templates(builder);
        }
        let control = wiring.start().await.unwrap();
        control.keys().seed_api_key("test", API_KEY).await.unwrap();
        let app = warren_server::app(control.clone(), proxy, server);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // The server's own listener (timeouts, connection caps), as `warren serve` runs it.
        let task = tokio::spawn(async move {
            let _ =
                warren_server::serve_all(listener, tls, app, limits, std::future::pending()).await;
        });
        TestServer {
            base: format!("http://{addr}"),
            addr,
            control,
            runtime,
            dir,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn client(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    /// Creates a `base` sandbox and returns the create response.
    pub async fn create(&self, body: serde_json::Value) -> serde_json::Value {
        let r = self
            .client()
            .post(self.url("/v2/sandboxes"))
            .header("X-API-KEY", API_KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{:?}", r.text().await);
        r.json().await.unwrap()
    }

    /// One API call with `key`: the status and the JSON body (`Null` when there is none).
    pub async fn call_as(
        &self,
        key: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = self
            .client()
            .request(method, self.url(path))
            .header("X-API-KEY", key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    }

    pub async fn stop(self) -> (tempfile::TempDir, Arc<AgentRuntime>) {
        self.control.shutdown();
        self.task.abort();
        (self.dir, self.runtime)
    }
}

/// One Connect envelope (the agent client's own codec, so the tests frame as it does).
pub fn envelope(flags: u8, json: &serde_json::Value) -> Vec<u8> {
    let payload = serde_json::to_vec(json).unwrap();
    warren_proto::connect::encode_frame(flags, &payload).unwrap()
}

/// Splits a Connect stream body into (flags, json) envelopes; a body cut inside an envelope
/// (a stream aborted mid-message) keeps the whole ones before the cut.
pub fn envelopes(body: &[u8]) -> Vec<(u8, serde_json::Value)> {
    let mut d = warren_proto::connect::Decoder::new(usize::MAX);
    d.push(body);
    std::iter::from_fn(|| d.next_raw().unwrap())
        .map(|(flags, payload)| (flags, serde_json::from_slice(&payload).unwrap()))
        .collect()
}

//! Lifecycle tests of the domain alone.
//!
//! The runtime and store here are in-test fakes, on purpose and ONLY for these domain unit
//! tests of the state machine: they check the control plane's decisions (states, expiry,
//! limits, recovery) without creating real sandboxes. Real agents and the SQLite store are
//! exercised by `warren-server`'s and `warren-store`'s tests.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use warren_control::{
    ApiKey, Config, Control, ControlError, CreateRequest, ListQuery, Sandbox, SandboxState, Store,
    StoreError,
};
use warren_runtime::{
    Capabilities, CreateSpec, Exit, RuntimeError, RuntimeSandbox, SandboxRuntime,
};

#[derive(Default)]
struct FakeRuntime {
    alive: Mutex<HashMap<String, RuntimeSandbox>>,
    /// Ids `reattach` should report as lost.
    lose: Mutex<Vec<String>>,
}

#[async_trait]
impl SandboxRuntime for FakeRuntime {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    async fn create(&self, spec: CreateSpec) -> Result<RuntimeSandbox, RuntimeError> {
        if spec.template != "base" {
            return Err(RuntimeError::UnknownTemplate(spec.template));
        }
        let rt = RuntimeSandbox {
            id: spec.id.clone(),
            agent: SocketAddr::from(([127, 0, 0, 1], 1)),
            record: serde_json::json!({"fake": true}),
        };
        self.alive.lock().unwrap().insert(spec.id, rt.clone());
        Ok(rt)
    }
    async fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        self.alive
            .lock()
            .unwrap()
            .remove(id)
            .map(|_| ())
            .ok_or_else(|| RuntimeError::NotFound(id.into()))
    }
    async fn status(&self, id: &str) -> Result<Option<Exit>, RuntimeError> {
        if self.alive.lock().unwrap().contains_key(id) {
            Ok(None)
        } else {
            Err(RuntimeError::NotFound(id.into()))
        }
    }
    async fn reattach(
        &self,
        records: Vec<RuntimeSandbox>,
    ) -> Vec<(String, Result<RuntimeSandbox, RuntimeError>)> {
        let lose = self.lose.lock().unwrap().clone();
        records
            .into_iter()
            .map(|r| {
                if lose.contains(&r.id) {
                    (
                        r.id.clone(),
                        Err(RuntimeError::Failed("process is gone".into())),
                    )
                } else {
                    (r.id.clone(), Ok(r))
                }
            })
            .collect()
    }
}

#[derive(Default)]
struct MemStore {
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    keys: Mutex<Vec<ApiKey>>,
}

#[async_trait]
impl Store for MemStore {
    async fn insert_sandbox(&self, s: &Sandbox) -> Result<(), StoreError> {
        self.sandboxes
            .lock()
            .unwrap()
            .insert(s.id.clone(), s.clone());
        Ok(())
    }
    async fn update_sandbox(&self, s: &Sandbox) -> Result<(), StoreError> {
        self.insert_sandbox(s).await
    }
    async fn get_sandbox(&self, id: &str) -> Result<Option<Sandbox>, StoreError> {
        Ok(self.sandboxes.lock().unwrap().get(id).cloned())
    }
    async fn sandboxes_in(&self, states: &[SandboxState]) -> Result<Vec<Sandbox>, StoreError> {
        Ok(self
            .sandboxes
            .lock()
            .unwrap()
            .values()
            .filter(|s| states.contains(&s.state))
            .cloned()
            .collect())
    }
    async fn insert_api_key(&self, k: &ApiKey) -> Result<(), StoreError> {
        self.keys.lock().unwrap().push(k.clone());
        Ok(())
    }
    async fn api_key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        Ok(self
            .keys
            .lock()
            .unwrap()
            .iter()
            .find(|k| k.hash == hash && k.revoked_at.is_none())
            .cloned())
    }
    async fn api_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        Ok(self.keys.lock().unwrap().clone())
    }
    async fn revoke_api_key(&self, id: &str) -> Result<bool, StoreError> {
        let mut keys = self.keys.lock().unwrap();
        match keys
            .iter_mut()
            .find(|k| k.id == id && k.revoked_at.is_none())
        {
            Some(k) => {
                k.revoked_at = Some(chrono::Utc::now());
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

fn base() -> CreateRequest {
    CreateRequest {
        template: "base".into(),
        ..Default::default()
    }
}

async fn start(config: Config) -> (Control, Arc<MemStore>, Arc<FakeRuntime>) {
    let store = Arc::new(MemStore::default());
    let rt = Arc::new(FakeRuntime::default());
    let c = Control::start(store.clone(), rt.clone(), config)
        .await
        .unwrap();
    (c, store, rt)
}

#[tokio::test]
async fn create_get_kill() {
    let (c, store, rt) = start(Config::default()).await;
    let sb = c.create(base()).await.unwrap();
    assert_eq!(sb.state, SandboxState::Running);
    assert!(c.route(&sb.id).is_some());
    assert_eq!(
        store.get_sandbox(&sb.id).await.unwrap().unwrap().state,
        SandboxState::Running
    );
    let route = c.route(&sb.id).unwrap();
    c.kill(&sb.id).await.unwrap();
    assert!(route.cancel.is_cancelled(), "open streams must be cut");
    assert!(c.route(&sb.id).is_none());
    assert!(rt.alive.lock().unwrap().is_empty());
    assert!(matches!(
        c.get(&sb.id).await,
        Err(ControlError::NotFound(_))
    ));
    assert!(matches!(
        c.kill(&sb.id).await,
        Err(ControlError::NotFound(_))
    ));
    assert_eq!(
        store.get_sandbox(&sb.id).await.unwrap().unwrap().state,
        SandboxState::Killed
    );
}

#[tokio::test]
async fn bad_input_changes_nothing() {
    let (c, store, _) = start(Config::default()).await;
    for t in [Some(0), Some(-5), Some(10_000_000)] {
        let r = c
            .create(CreateRequest {
                timeout: t,
                ..base()
            })
            .await;
        assert!(matches!(r, Err(ControlError::InvalidArgument(_))), "{t:?}");
    }
    let r = c
        .create(CreateRequest {
            template: "nope".into(),
            ..Default::default()
        })
        .await;
    assert!(matches!(r, Err(ControlError::NotFound(_))));
    assert!(c
        .list(&ListQuery::default())
        .await
        .unwrap()
        .items
        .is_empty());
    // The failed creation is remembered as failed, never as running.
    assert!(store
        .sandboxes
        .lock()
        .unwrap()
        .values()
        .all(|s| s.state == SandboxState::Failed));
}

#[tokio::test]
async fn expiry_kills_at_end_time() {
    let (c, _, rt) = start(Config::default()).await;
    let sb = c.create(base()).await.unwrap();
    c.set_timeout(&sb.id, 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(matches!(
        c.get(&sb.id).await,
        Err(ControlError::NotFound(_))
    ));
    assert!(rt.alive.lock().unwrap().is_empty());
}

#[tokio::test]
async fn connect_only_extends() {
    let (c, _, _) = start(Config::default()).await;
    let sb = c
        .create(CreateRequest {
            timeout: Some(600),
            ..base()
        })
        .await
        .unwrap();
    let (after, resumed) = c.connect(&sb.id, Some(10)).await.unwrap();
    assert!(!resumed);
    assert_eq!(after.end_at, sb.end_at);
    let (after, _) = c.connect(&sb.id, Some(3600)).await.unwrap();
    assert!(after.end_at > sb.end_at);
}

#[tokio::test]
async fn concurrency_limit() {
    let (c, _, _) = start(Config {
        max_concurrent: 2,
        ..Config::default()
    })
    .await;
    let a = c.create(base()).await.unwrap();
    c.create(base()).await.unwrap();
    match c.create(base()).await {
        Err(ControlError::ResourceExhausted { retry_after, .. }) => {
            assert!(retry_after > Duration::ZERO)
        }
        other => panic!("expected ResourceExhausted, got {other:?}"),
    }
    c.kill(&a.id).await.unwrap();
    c.create(base()).await.unwrap();
}

#[tokio::test]
async fn restart_reattaches_or_fails_with_reason() {
    let (c, store, rt) = start(Config::default()).await;
    let keep = c.create(base()).await.unwrap();
    let lost = c.create(base()).await.unwrap();
    c.shutdown();
    rt.lose.lock().unwrap().push(lost.id.clone());
    let c2 = Control::start(store.clone(), rt.clone(), Config::default())
        .await
        .unwrap();
    assert_eq!(c2.get(&keep.id).await.unwrap().state, SandboxState::Running);
    assert!(c2.route(&keep.id).is_some());
    let lost_rec = store.get_sandbox(&lost.id).await.unwrap().unwrap();
    assert_eq!(lost_rec.state, SandboxState::Failed);
    assert!(lost_rec.failure.unwrap().contains("process is gone"));
}

#[tokio::test]
async fn api_keys() {
    let (c, _, _) = start(Config::default()).await;
    assert!(matches!(
        c.authenticate("whatever").await,
        Err(ControlError::Unauthenticated)
    ));
    let k = c.create_api_key("ci").await.unwrap();
    assert_eq!(c.authenticate(&k.secret).await.unwrap().id, k.key.id);
    c.seed_api_key("env", "a-known-key-for-scripts")
        .await
        .unwrap();
    c.seed_api_key("env", "a-known-key-for-scripts")
        .await
        .unwrap();
    assert_eq!(c.api_keys().await.unwrap().len(), 2);
    c.revoke_api_key(&k.key.id).await.unwrap();
    assert!(c.authenticate(&k.secret).await.is_err());
    assert!(c.revoke_api_key(&k.key.id).await.is_err());
}

//! Sandboxes prepared ahead of creates: claims never share one, a claimed sandbox carries
//! nothing of another tenant and takes its create's limits, the pool follows demand and
//! empties, and a restart neither leaks nor reuses what was prepared. Needs root, nftables
//! and the base image.

mod common;

use common::run_as;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_host::HostConfig;
use warren_runtime::{CreateSpec, SandboxRuntime};
use warren_runtime_ns::NsRuntime;

fn config(tag: &str, octet: u32) -> Option<HostConfig> {
    common::HostTest {
        name: "prepared",
        tag,
        prefix: "wq",
        octet,
        pool_size: 2,
        private_data: false,
    }
    .config()
}

/// The pool on: at most 4 prepared.
fn settings() -> warren_runtime_ns::NsSettings {
    warren_runtime_ns::NsSettings {
        prepared_max: 4,
        ..common::ns_settings()
    }
}

fn spec(id: &str, token: Option<&str>, env: &[(&str, &str)]) -> CreateSpec {
    CreateSpec {
        resources: common::MEDIUM,
        allow_internet_access: true,
        env_vars: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        access_token: token.map(str::to_string),
        ..common::small_spec(id)
    }
}

/// A create that claims the prepared sandbox reserved as `id`.
fn claim(id: &str, token: Option<&str>, env: &[(&str, &str)]) -> CreateSpec {
    let mut spec = spec(id, token, env);
    spec.reservation = Some(warren_runtime::Reservation::new(spec.id.clone()));
    spec
}

/// Waits until `template` has `n` prepared sandboxes.
async fn wait_for(rt: &NsRuntime, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ids = rt.prepared_ids("base");
        if ids.len() == n {
            return ids;
        }
        assert!(
            Instant::now() < deadline,
            "{} prepared sandboxes, not {n}",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The host cgroup directory of sandbox `id` (the pids controller's on cgroup v1).
fn cgroup_dir(cfg: &HostConfig, id: &str) -> PathBuf {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let base = if v2 {
        PathBuf::from("/sys/fs/cgroup")
    } else {
        PathBuf::from("/sys/fs/cgroup/pids")
    };
    base.join(&cfg.cgroup_parent).join(id)
}

/// The memory limit the host put on sandbox `id`.
fn memory_limit(cfg: &HostConfig, id: &str) -> u64 {
    let v2 = Path::new("/sys/fs/cgroup")
        .join(&cfg.cgroup_parent)
        .join(id)
        .join("memory.max");
    let v1 = Path::new("/sys/fs/cgroup/memory")
        .join(&cfg.cgroup_parent)
        .join(id)
        .join("memory.limit_in_bytes");
    let text = std::fs::read_to_string(&v2)
        .or_else(|_| std::fs::read_to_string(&v1))
        .expect("the sandbox's memory limit");
    text.trim().parse().expect("a number")
}

/// Status of a request to `agent` with `token` (none: no header).
async fn status_with(agent: std::net::SocketAddr, token: Option<&str>) -> u16 {
    let mut req = reqwest::Client::new()
        .get(format!("http://{agent}/envs"))
        .timeout(Duration::from_secs(5));
    if let Some(t) = token {
        req = req.header("x-access-token", t);
    }
    req.send().await.expect("agent answers").status().as_u16()
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_never_share_and_carry_nothing_of_the_last_tenant() {
    let Some(cfg) = config("c", 41) else { return };
    let rt: Arc<NsRuntime> = NsRuntime::start(cfg.clone(), settings())
        .await
        .expect("start");
    assert!(rt.reattach(vec![]).await.is_empty());
    rt.set_warm_pool("base", 3).await.expect("pool of 3");
    let prepared: HashSet<String> = wait_for(&rt, 3).await.into_iter().collect();

    // Eight creates race for three prepared sandboxes.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let rt = rt.clone();
        tasks.push(tokio::spawn(async move {
            rt.reserve_prepared("base")
                .await
                .map(|r| r.id().to_string())
        }));
    }
    let mut claimed = Vec::new();
    for t in tasks {
        if let Some(id) = t.await.unwrap() {
            claimed.push(id);
        }
    }
    let distinct: HashSet<&String> = claimed.iter().collect();
    assert_eq!(
        distinct.len(),
        claimed.len(),
        "one sandbox handed out twice: {claimed:?}"
    );
    assert!(!claimed.is_empty() && claimed.len() <= 3, "{claimed:?}");
    assert!(claimed.iter().all(|id| prepared.contains(id)));

    // The first tenant leaves files, a process and env vars behind, then goes.
    let first = &claimed[0];
    let a = rt
        .create(claim(first, Some("tok-a"), &[("SECRET", "tenant-a")]))
        .await
        .expect("claim a");
    let (code, out) = run_as(a.agent, "tok-a", "echo $SECRET $E2B_SANDBOX_ID; hostname; echo kept > /home/user/left; (sleep 1000 &) ; cat /proc/sys/kernel/random/boot_id").await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("tenant-a {first}"));
    assert_eq!(lines[1], first.as_str(), "the hostname is the sandbox's id");
    let boot_a = lines[2].to_string();
    assert_eq!(
        status_with(a.agent, None).await,
        401,
        "the tenant's token is required"
    );
    rt.kill(first).await.expect("kill a");

    // The next tenant, on another prepared sandbox, without a token (secure off).
    let b_id = match claimed.get(1) {
        Some(id) => id.clone(),
        None => {
            wait_for(&rt, 3).await;
            rt.reserve_prepared("base")
                .await
                .map(|r| r.id().to_string())
                .expect("a prepared sandbox")
        }
    };
    let mut b_spec = claim(&b_id, None, &[]);
    b_spec.resources.memory_mb = 256;
    b_spec.resources.disk_mb = 128;
    b_spec.allow_internet_access = false;
    let b = rt.create(b_spec).await.expect("claim b");
    assert_eq!(b.record["allow_internet_access"], false, "{}", b.record);
    let (code, out) = run_as(
        b.agent,
        "",
        "test -e /home/user/left && echo FILE; pgrep -x sleep && echo PROC; echo \"[$SECRET]\"; cat /proc/sys/kernel/random/boot_id; df -m --output=size / | tail -1",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "[]", "nothing of the last tenant: {out}");
    assert_ne!(lines[1], boot_a, "a boot of its own");
    let size: u64 = lines[2].trim().parse().expect("df size");
    assert!(
        (120..=130).contains(&size),
        "the disk its create asked for: {size} MiB"
    );
    assert_eq!(
        memory_limit(&cfg, &b_id),
        256 << 20,
        "the memory its create asked for"
    );
    // No token now lets anyone in; the first tenant's token means nothing here.
    assert_eq!(status_with(b.agent, None).await, 200);
    rt.kill(&b_id).await.expect("kill b");

    // The other reservations are claimed too (one left unclaimed goes after a minute).
    for id in claimed.iter().skip(2) {
        let c = rt
            .create(claim(id, Some("tok-c"), &[]))
            .await
            .expect("claim c");
        assert_eq!(run_as(c.agent, "tok-c", "echo ok").await.1, "ok\n");
        rt.kill(id).await.expect("kill c");
    }
    rt.shutdown().await.expect("shutdown");
    for id in &prepared {
        assert!(!cgroup_dir(&cfg, id).exists(), "{id} left its cgroup");
    }
    common::cleanup(&cfg);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pool_follows_demand_and_empties() {
    let Some(cfg) = config("d", 42) else { return };
    let rt: Arc<NsRuntime> = NsRuntime::start(cfg.clone(), settings())
        .await
        .expect("start");
    assert!(rt.reattach(vec![]).await.is_empty());
    // No demand yet: nothing is prepared, nothing idles.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(rt.prepared_ids("base").is_empty());
    assert_eq!(rt.prepared().unwrap().ready, 0);

    // One create: one in flight at its peak, so two wait for the next ones.
    let id = warren_runtime::SandboxId::generate().unwrap().to_string();
    rt.create(spec(&id, Some("tok"), &[]))
        .await
        .expect("create");
    let ready = wait_for(&rt, 2).await;
    let stats = rt.prepared().unwrap();
    assert_eq!((stats.ready, stats.target), (2, 2), "{stats:?}");
    assert!(
        stats.memory_bytes > 0,
        "the idle cost is reported: {stats:?}"
    );
    rt.kill(&id).await.expect("kill");

    // A claim is replaced.
    let taken = rt
        .reserve_prepared("base")
        .await
        .map(|r| r.id().to_string())
        .expect("reserved");
    assert!(ready.contains(&taken));
    // A spec must carry its own reservation: another sandbox's is refused, nothing starts.
    let mut wrong = claim(&taken, Some("tok"), &[]);
    wrong.id = warren_runtime::SandboxId::generate().unwrap();
    let refused = rt
        .create(wrong)
        .await
        .expect_err("another id's reservation");
    assert_eq!(
        refused.category(),
        warren_runtime::Category::BadRequest,
        "{refused}"
    );
    rt.create(claim(&taken, Some("tok"), &[]))
        .await
        .expect("claim");
    // Two creates within a second now: the target may have grown by one.
    let target = rt.prepared().unwrap().target;
    let refilled = wait_for(&rt, target).await;
    assert!(!refilled.contains(&taken));
    rt.kill(&taken).await.expect("kill");

    // A fixed size above the cap stops at the cap; zero empties the pool and frees all.
    rt.set_warm_pool("base", 10).await.expect("pool of 10");
    let full = wait_for(&rt, 4).await;
    rt.set_warm_pool("base", 0).await.expect("pool of 0");
    wait_for(&rt, 0).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while full
        .iter()
        .any(|id| cgroup_dir(&cfg, id).exists() || rt.holds_ids(id))
    {
        assert!(
            Instant::now() < deadline,
            "discarded sandboxes still hold their cgroup or ids"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rt.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_neither_leaks_nor_reuses_prepared_sandboxes() {
    let Some(cfg) = config("r", 43) else { return };
    let first: Arc<NsRuntime> = NsRuntime::start(cfg.clone(), settings())
        .await
        .expect("start");
    first.reattach(vec![]).await;
    first.set_warm_pool("base", 3).await.expect("pool of 3");
    wait_for(&first, 3).await;
    let claimed = first
        .reserve_prepared("base")
        .await
        .map(|r| r.id().to_string())
        .expect("reserved");
    let kept = first
        .create(claim(&claimed, Some("tok"), &[]))
        .await
        .expect("claim");
    let left = wait_for(&first, 3).await;
    // The server dies: nothing is torn down.
    let second = common::restart(first, &cfg, settings()).await;
    let back = second.reattach(vec![kept.clone()]).await;
    assert!(
        back[0].1.is_ok(),
        "the claimed sandbox is taken back: {back:?}"
    );
    assert_eq!(run_as(kept.agent, "tok", "echo ok").await.1, "ok\n");
    for id in &left {
        assert!(
            !cgroup_dir(&cfg, id).exists(),
            "prepared {id} outlived the restart"
        );
        assert!(!second.holds_ids(id), "prepared {id} kept its id range");
    }
    second.set_warm_pool("base", 2).await.expect("pool of 2");
    let fresh = wait_for(&second, 2).await;
    assert!(fresh.iter().all(|id| !left.contains(id) && *id != claimed));
    second.kill(&claimed).await.expect("kill");
    second.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

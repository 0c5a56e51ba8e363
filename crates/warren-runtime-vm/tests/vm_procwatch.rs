//! Programs executed inside a microVM reach its agent's journal (`GET /journal`): the agent is
//! root of the guest kernel and watches its process events. Needs root, nftables, QEMU and the
//! base image; without root or QEMU the test prints `SKIP:` and why.

mod common;

use common::run;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use warren_runtime::{CreateSpec, SandboxRuntime};
use warren_runtime_vm::VmRuntime;

fn spec(id: &str) -> CreateSpec {
    common::small_spec(id)
}

async fn journal(agent: std::net::SocketAddr) -> Vec<Value> {
    let page: Value = reqwest::Client::new()
        .get(format!("http://{agent}/journal?after=0&limit=1000"))
        .header("x-access-token", "tok")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    page["entries"].as_array().cloned().unwrap_or_default()
}

fn argv(e: &Value) -> Vec<String> {
    serde_json::from_str(e["fields"]["argv"].as_str().unwrap_or("[]")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn programs_run_in_a_microvm_are_in_its_agent_s_journal() {
    let Some((cfg, vm)) = common::VmTest {
        name: "vmprocs",
        prefix: "wj",
        octet: 41,
        pool_size: 1,
        warm_pool: 0,
    }
    .config("a", 0, Path::new(common::SHARED_DATA)) else {
        return;
    };
    let rt = VmRuntime::start(cfg.clone(), vm.clone())
        .await
        .expect("start");
    rt.reattach(vec![]).await;
    let a = rt
        .create(spec("vmprocsa"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    // The vm runtime leaves watching to the agent.
    assert!(rt.journal("vmprocsa", 0, 10).await.is_none());

    let script = "echo $$; ls / > /dev/null; /bin/sleep 0.2; exit 3";
    let (code, out) = run(a.agent, &format!("cd /tmp; /bin/sh -c '{script}'")).await;
    assert_eq!(code, 3, "{out}");
    let shell_pid = out.trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all = journal(a.agent).await;
        let shell = all
            .iter()
            .find(|e| e["kind"] == "process.exec" && argv(e).len() == 3 && argv(e)[2] == script);
        let ls = all
            .iter()
            .find(|e| e["kind"] == "process.exec" && argv(e) == ["ls", "/"]);
        let exit = all.iter().find(|e| {
            e["kind"] == "process.exit" && e["fields"]["pid"].as_str() == Some(&shell_pid)
        });
        if let (Some(shell), Some(ls), Some(exit)) = (shell, ls, exit) {
            assert_eq!(shell["fields"]["pid"], shell_pid.as_str(), "{shell}");
            assert_eq!(shell["fields"]["user"], "user", "{shell}");
            assert_eq!(shell["fields"]["cwd"], "/tmp", "{shell}");
            assert_eq!(ls["fields"]["ppid"], shell_pid.as_str(), "{ls}");
            assert_eq!(exit["fields"]["exit_code"], "3", "{exit}");
            let ran: u64 = exit["fields"]["duration_ms"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(ran >= 200, "{exit}");
            break;
        }
        assert!(Instant::now() < deadline, "missing entries: {all:#?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    rt.kill("vmprocsa").await.expect("kill");
    rt.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

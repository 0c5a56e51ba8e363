//! The runtime's journal of programs executed inside a sandbox, watched from the host: what a
//! command runs shows up with its argv, the sandbox's own pids and uid, its working directory
//! and its exit status, in that sandbox's journal only. Needs root (of the initial
//! namespaces, for the kernel's process events), nftables and the base image.

mod common;

use common::run;

use std::time::{Duration, Instant};

use serde_json::Value;
use warren_host::HostConfig;
use warren_proto::journal::JournalEntry;
use warren_runtime::SandboxRuntime;
use warren_runtime_ns::NsRuntime;

fn config() -> Option<HostConfig> {
    common::HostTest {
        name: "procs",
        tag: "",
        prefix: "wk",
        octet: 37,
        pool_size: 2,
        private_data: false,
    }
    .config()
}

fn argv(e: &JournalEntry) -> Vec<String> {
    e.fields
        .get("argv")
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

fn field<'a>(e: &'a JournalEntry, name: &str) -> &'a str {
    e.fields.get(name).map(String::as_str).unwrap_or("")
}

/// Every entry of `id`'s journal, following the cursor.
async fn entries(rt: &NsRuntime, id: &str) -> Option<Vec<JournalEntry>> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = rt.journal(id, after, 1000).await?;
        assert_eq!(page.dropped, 0);
        if page.entries.is_empty() {
            return Some(out);
        }
        for (i, e) in page.entries.iter().enumerate() {
            assert_eq!(e.seq, after + 1 + i as u64, "no gaps");
        }
        after = page.next;
        out.extend(page.entries);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn programs_run_in_a_sandbox_are_journaled_in_its_own_terms() {
    let Some(cfg) = config() else { return };
    if let Err(e) = warren_procwatch::Watcher::subscribe() {
        warren_testkit::skip(format!("the process events connector: {e}"));
        return;
    }
    let rt = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    rt.reattach(vec![]).await;
    let a = rt
        .create(common::small_spec("procsa"))
        .await
        .expect("create a");
    let _b = rt
        .create(common::small_spec("procsb"))
        .await
        .expect("create b");
    assert!(rt.journal("nosuch", 0, 10).await.is_none());

    // Programs that live a while: one gone before its /proc is read is journaled by its name
    // only, or not at all (see docs/runtime-ns.md).
    let script = "echo $$; id -u; ls -R /usr > /dev/null; /bin/sleep 0.3; exit 3";
    let (code, out) = run(a.agent, &format!("cd /tmp; /bin/sh -c '{script}'")).await;
    assert_eq!(code, 3, "{out}");
    let mut lines = out.lines();
    let shell_pid = lines.next().unwrap().trim().to_string();
    let uid = lines.next().unwrap().trim().to_string();
    assert_ne!(uid, "0", "commands run as the sandbox's user");

    let deadline = Instant::now() + Duration::from_secs(10);
    let (shell, ls, sleep, exit) = loop {
        let all = entries(&rt, "procsa").await.expect("a is watched");
        let exec = |want: &dyn Fn(&[String]) -> bool| {
            all.iter()
                .find(|e| e.kind == "process.exec" && want(&argv(e)))
                .cloned()
        };
        let shell = exec(&|a| a.len() == 3 && a[0] == "/bin/sh" && a[2] == script);
        let ls = exec(&|a| a == ["ls", "-R", "/usr"]);
        let sleep = exec(&|a| a == ["/bin/sleep", "0.3"]);
        let exit = all
            .iter()
            .find(|e| e.kind == "process.exit" && field(e, "pid") == shell_pid)
            .cloned();
        if let (Some(s), Some(l), Some(z), Some(x)) = (&shell, &ls, &sleep, &exit) {
            break (s.clone(), l.clone(), z.clone(), x.clone());
        }
        assert!(
            Instant::now() < deadline,
            "missing entries (shell {}, ls {}, sleep {}, exit {}): {all:#?}",
            shell.is_some(),
            ls.is_some(),
            sleep.is_some(),
            exit.is_some()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The shell as the sandbox sees it: its pid (the one `$$` printed), uid and directory.
    assert_eq!(field(&shell, "pid"), shell_pid, "{shell:?}");
    assert_eq!(field(&shell, "uid"), uid, "{shell:?}");
    assert_eq!(field(&shell, "cwd"), "/tmp", "{shell:?}");
    assert!(
        shell_pid.parse::<u32>().unwrap() < 1000,
        "a pid of the sandbox's own numbering: {shell_pid}"
    );
    assert_eq!(shell.message, format!("exec /bin/sh -c {script}"));
    // Its children: parent is the shell, same owner.
    for child in [&ls, &sleep] {
        assert_eq!(field(child, "ppid"), shell_pid, "{child:?}");
        assert_eq!(field(child, "uid"), uid, "{child:?}");
        assert!(child.seq > shell.seq);
    }
    assert_eq!(field(&exit, "exit_code"), "3", "{exit:?}");
    let ran: u64 = field(&exit, "duration_ms").parse().unwrap();
    assert!(
        ran >= 300,
        "the shell ran at least as long as its sleep: {ran} ms"
    );
    let sleep_pid = field(&sleep, "pid").to_string();
    let all = entries(&rt, "procsa").await.unwrap();
    assert!(
        all.iter().any(|e| e.kind == "process.exit"
            && field(e, "pid") == sleep_pid
            && field(e, "exit_code") == "0"),
        "{all:#?}"
    );

    // The other sandbox saw none of it.
    let other = entries(&rt, "procsb").await.expect("b is watched");
    assert!(
        !other
            .iter()
            .any(|e| e.message.contains(script) || argv(e) == ["ls", "-R", "/usr"]),
        "{other:#?}"
    );

    rt.kill("procsa").await.expect("kill a");
    assert!(rt.journal("procsa", 0, 10).await.is_none(), "forgotten");
    rt.kill("procsb").await.expect("kill b");
    // With no sandbox left the watching thread ends (and unsubscribes): a host without
    // sandboxes pays nothing.
    let deadline = Instant::now() + Duration::from_secs(5);
    while watching_threads() > 0 {
        assert!(
            Instant::now() < deadline,
            "the watcher outlived the sandboxes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rt.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

/// Threads of this process named as the runtime's watcher.
fn watching_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "procwatch")
        })
        .count()
}

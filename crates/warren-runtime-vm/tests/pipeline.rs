//! The boot pipeline end to end under TCG: cold boot to a listening agent, snapshot, two
//! forks restored from it that answer and are independent of each other.

mod common;

use std::time::Duration;

use warren_runtime_vm::snapshot::{self, ForkSpec, Pending};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_snapshot_and_independent_forks() {
    let Some((agent, _vminit, image)) = common::prerequisites() else {
        return;
    };
    // Mode 0700, root's: fork b's jailed QEMU reaches the snapshot through its jail.
    let tmp = tempfile::tempdir_in("/run").unwrap();
    let net_a = common::TestNet::new("a");
    let net_b = common::TestNet::new("b");
    let spec = common::template_spec((&common::data_dir(), tmp.path()), &agent, &image, &net_a);
    let snap = snapshot::create(&spec, "test", &tmp.path().join("snap"), async { Ok(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cold boot to agent: {} ms", snap.meta.boot_ms);
    assert!(snap.state().metadata().unwrap().len() > 0);

    let mut forks = Vec::new();
    for (name, net) in [("a", &net_a), ("b", &net_b)] {
        let spec = ForkSpec {
            qemu: "qemu-system-x86_64".into(),
            dir: tmp.path().join(format!("fork-{name}")),
            tap: Some("tap0".into()),
            netns: Some(net.path()),
            run_as: (name == "b").then_some((300_001, 300_001)),
            backing_link: None,
        };
        let t = std::time::Instant::now();
        let pending = Pending::spawn(&snap, &spec)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let waiting = t.elapsed();
        let restored = pending.complete().await.unwrap_or_else(|e| panic!("{e}"));
        let (child, qmp) = (restored.child, restored.qmp);
        let running = t.elapsed();
        assert_eq!(qmp.status().await.unwrap(), "running");
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", child.id().unwrap())).unwrap();
        let uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .unwrap()
            .to_string();
        let expect = if name == "b" { "300001" } else { "0" };
        assert!(uid.split_whitespace().skip(1).all(|u| u == expect), "{uid}");
        let r = net
            .http("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        assert!(r.starts_with("HTTP/1.1 204"), "{r}");
        // Printed for whoever looks; no threshold (TCG speed varies with the host's load).
        eprintln!(
            "fork {name}: QEMU waiting after {} ms, running after {} ms, first agent reply after {} ms",
            waiting.as_millis(),
            running.as_millis(),
            t.elapsed().as_millis()
        );
        if name == "b" {
            // Jailed: own mount namespace whose root is not the host's, no environment, no
            // new privileges; the snapshot's files are root's alone on the host.
            let pid = child.id().unwrap();
            let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
            assert!(!root.join("etc/shadow").exists());
            assert!(root.join(snap.mem().strip_prefix("/").unwrap()).exists());
            assert!(std::fs::read(format!("/proc/{pid}/environ"))
                .unwrap()
                .is_empty());
            assert!(status.contains("NoNewPrivs:\t1"), "{status}");
            use std::os::unix::fs::MetadataExt;
            for f in [snap.mem(), snap.state(), snap.disk()] {
                let m = std::fs::metadata(&f).unwrap();
                assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o400), "{}", f.display());
            }
        }
        forks.push((child, qmp));
    }
    for net in [&net_a, &net_b] {
        let r = net
            .http("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        assert!(r.starts_with("HTTP/1.1 204"), "{r}");
    }
    // Independence: a file written in fork a is not in fork b.
    let body = "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nonly-a\r\n--b--\r\n";
    let put = format!(
        "POST /files?path=/tmp/fork-a.txt&username=root HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = net_a.http(&put).unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let get = "GET /files?path=/tmp/fork-a.txt&username=root HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let ra = net_a.http(get).unwrap();
    assert!(
        ra.starts_with("HTTP/1.1 200") && ra.contains("only-a"),
        "{ra}"
    );
    let rb = net_b.http(get).unwrap();
    assert!(rb.starts_with("HTTP/1.1 404"), "{rb}");

    for (mut child, qmp) in forks {
        let _ = qmp.execute("quit", serde_json::json!({})).await;
        let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        let _ = child.start_kill();
    }
    warren_runtime_vm::snapshot::remove_vm_dir(&tmp.path().join("fork-b"));
}

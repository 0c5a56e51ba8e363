//! Pulls from a real registry (Debian's `docker-registry`) started on 127.0.0.1 by each test,
//! with images the test builds and pushes itself. Without the registry binary the tests print
//! `SKIP:` (or fail under `WARREN_REQUIRE_ALL=1`).

mod common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::sync::Mutex;

use common::*;
use warren_oci::{unpack, Credentials, Mirror, PullError, PullOptions, Puller};

fn options(cache: &std::path::Path, reg: &Registry) -> PullOptions {
    let mut opts = PullOptions::new(cache);
    if reg.ca.is_some() {
        opts.ca_files = reg.ca.iter().cloned().collect();
        // A loopback registry over HTTPS: allowed by the operator.
        opts.allow = vec![reg.host().parse().unwrap()];
    } else {
        opts.insecure = vec![reg.host()];
    }
    opts
}

/// Runs a pull and keeps its progress lines.
async fn pull_logged(
    puller: &Puller,
    reference: &str,
    creds: &Credentials,
) -> (Result<warren_oci::PulledImage, PullError>, Vec<String>) {
    let lines = Mutex::new(Vec::new());
    let result = puller
        .pull(reference, creds, &|line| lines.lock().unwrap().push(line))
        .await;
    (result, lines.into_inner().unwrap())
}

#[tokio::test]
async fn anonymous_pull_unpacks_layers_with_whiteouts_owners_and_modes_then_reuses_the_cache() {
    if !have_registry(false) || !warren_testkit::require("root", warren_testkit::is_root()) {
        return;
    }
    let reg = Registry::start();
    reg.push("test/app", "1", &sample_image()).await;
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(options(cache.path(), &reg)).unwrap();
    let reference = format!("{}/test/app:1", reg.host());

    let (image, lines) = pull_logged(&puller, &reference, &Credentials::Anonymous).await;
    let image = image.unwrap();
    assert_eq!(image.reference, reference);
    assert_eq!(image.layers.len(), 3);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines.iter().all(|l| l.starts_with("pulling sha256:")),
        "{lines:?}"
    );
    let c = &image.config;
    assert_eq!(
        c.env,
        vec![
            (
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin".to_string()
            ),
            ("GREETING".to_string(), "hello world".to_string())
        ]
    );
    assert_eq!(c.working_dir.as_deref(), Some("/home/app"));
    assert_eq!(c.user.as_deref(), Some("1000:1001"));
    assert_eq!(c.entrypoint, ["/bin/sh", "-c"]);
    assert_eq!(c.cmd, ["/home/app/run.sh"]);
    assert_eq!(c.exposed_ports, ["8080/tcp"]);
    for layer in &image.layers {
        assert!(layer.path.starts_with(cache.path()));
        assert_eq!(std::fs::metadata(&layer.path).unwrap().len(), layer.size);
    }

    let root = tempfile::tempdir().unwrap();
    let written = unpack(&image, root.path()).unwrap();
    assert!(written > 0);
    let r = root.path();
    assert_eq!(
        std::fs::read_to_string(r.join("etc/os-release")).unwrap(),
        "ID=warren-test\n"
    );
    assert!(
        !r.join("etc/gone").exists(),
        "a whiteout removes the lower file"
    );
    assert!(
        !r.join("opaque/old").exists(),
        "an opaque dir hides lower entries"
    );
    assert_eq!(
        std::fs::read_to_string(r.join("opaque/new")).unwrap(),
        "from layer two\n"
    );
    let run = std::fs::metadata(r.join("home/app/run.sh")).unwrap();
    assert_eq!((run.uid(), run.gid()), (1000, 1001));
    assert_eq!(run.permissions().mode() & 0o7777, 0o4755, "setuid kept");
    assert_eq!(run.mtime(), 1_600_000_000);
    let app = std::fs::metadata(r.join("home/app")).unwrap();
    assert_eq!(app.permissions().mode() & 0o7777, 0o750);
    assert_eq!(app.mtime(), 1_600_000_000, "directory mtimes are set last");
    assert_eq!(
        std::fs::read_link(r.join("bin")).unwrap(),
        std::path::Path::new("usr/bin")
    );
    assert_eq!(
        std::fs::read_to_string(r.join("usr/bin/tool")).unwrap(),
        "through the bin symlink\n",
        "a path through an image symlink lands where the symlink points, inside the root"
    );
    let a = std::fs::metadata(r.join("etc/os-release")).unwrap();
    let b = std::fs::metadata(r.join("etc/os-release.link")).unwrap();
    assert_eq!(a.ino(), b.ino(), "hard link");
    assert_eq!(
        std::fs::read_to_string(r.join("etc/motd")).unwrap(),
        "top layer\n"
    );

    // Second pull: every layer comes from the cache, and the registry serves no blob again.
    let gets = reg.blob_gets();
    assert!(gets >= 4, "config and three layers fetched once: {gets}");
    let (again, lines) = pull_logged(&puller, &reference, &Credentials::Anonymous).await;
    let again = again.unwrap();
    assert_eq!(again.manifest_digest, image.manifest_digest);
    assert_eq!(lines.len(), 3);
    assert!(
        lines.iter().all(|l| l.starts_with("cached sha256:")),
        "{lines:?}"
    );
    assert_eq!(reg.blob_gets(), gets, "no blob fetched twice");
}

#[tokio::test]
async fn missing_images_are_not_found() {
    if !have_registry(false) {
        return;
    }
    let reg = Registry::start();
    reg.push("test/app", "1", &tiny_image("amd64", "x")).await;
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(options(cache.path(), &reg)).unwrap();
    for reference in [
        format!("{}/test/app:2", reg.host()),
        format!("{}/test/nope:latest", reg.host()),
    ] {
        let err = puller
            .pull(&reference, &Credentials::Anonymous, &|_| {})
            .await
            .unwrap_err();
        assert!(matches!(err, PullError::NotFound { .. }), "{err:?}");
        assert_eq!(err.to_string(), format!("image {reference} not found"));
    }
    let err = puller
        .pull("Not A Reference", &Credentials::Anonymous, &|_| {})
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::BadReference { .. }), "{err:?}");
}

#[tokio::test]
async fn an_index_gives_its_linux_amd64_image() {
    if !have_registry(false) {
        return;
    }
    let reg = Registry::start();
    let arm = reg
        .push("test/multi", "arm", &tiny_image("arm64", "arm"))
        .await;
    let amd = reg
        .push("test/multi", "amd", &tiny_image("amd64", "amd"))
        .await;
    let arm_size = reg.manifest_size("test/multi", &arm).await;
    let amd_size = reg.manifest_size("test/multi", &amd).await;
    reg.push_index(
        "test/multi",
        "both",
        &[(arm, arm_size, "arm64"), (amd.clone(), amd_size, "amd64")],
    )
    .await;
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(options(cache.path(), &reg)).unwrap();
    let image = puller
        .pull(
            &format!("{}/test/multi:both", reg.host()),
            &Credentials::Anonymous,
            &|_| {},
        )
        .await
        .unwrap();
    assert_eq!(image.manifest_digest, amd);
    assert!(image.index_digest.is_some());
    let root = tempfile::tempdir().unwrap();
    unpack(&image, root.path()).unwrap();
    assert_eq!(
        std::fs::read_to_string(root.path().join("marker")).unwrap(),
        "amd"
    );
}

#[tokio::test]
async fn a_docker_hub_name_is_pulled_from_its_mirror() {
    if !have_registry(false) {
        return;
    }
    let reg = Registry::start();
    let digest = reg
        .push("library/alpine", "3", &tiny_image("amd64", "mirrored"))
        .await;
    let cache = tempfile::tempdir().unwrap();
    let mut opts = PullOptions::new(cache.path());
    opts.mirrors = vec![format!("docker.io=http://{}", reg.host())
        .parse::<Mirror>()
        .unwrap()];
    let puller = Puller::new(opts).unwrap();
    let image = puller
        .pull("alpine:3", &Credentials::Anonymous, &|_| {})
        .await
        .unwrap();
    assert_eq!(image.reference, "docker.io/library/alpine:3");
    assert_eq!(image.manifest_digest, digest);
    let err = puller
        .pull("alpine:edge", &Credentials::Anonymous, &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PullError::NotFound { reference } if reference == "docker.io/library/alpine:edge"),
        "no fallback to Docker Hub: {err:?}"
    );
}

/// A pull of a sample image with `limit` applied to the options: its error, after checking
/// that no blob was fetched for it.
async fn refused_before_fetching(limit: impl FnOnce(&mut PullOptions)) -> Option<PullError> {
    if !have_registry(false) {
        return None;
    }
    let reg = Registry::start();
    reg.push("test/app", "1", &sample_image()).await;
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &reg);
    limit(&mut opts);
    let puller = Puller::new(opts).unwrap();
    let before = reg.blob_gets();
    let err = puller
        .pull(
            &format!("{}/test/app:1", reg.host()),
            &Credentials::Anonymous,
            &|_| {},
        )
        .await
        .unwrap_err();
    assert_eq!(reg.blob_gets(), before, "a blob was fetched: {err:?}");
    Some(err)
}

#[tokio::test]
async fn an_image_over_the_limit_is_refused_before_any_layer_is_fetched() {
    let Some(err) = refused_before_fetching(|o| o.max_bytes = 100).await else {
        return;
    };
    assert!(matches!(err, PullError::TooLarge { limit: 100 }), "{err:?}");
}

#[tokio::test]
async fn an_image_the_disk_has_no_room_for_is_refused_before_any_layer_is_fetched() {
    // A reserve no disk has room for.
    let Some(err) = refused_before_fetching(|o| o.min_free_bytes = u64::MAX / 2).await else {
        return;
    };
    assert!(
        matches!(err, PullError::NoRoom { reserve, .. } if reserve == u64::MAX / 2),
        "{err:?}"
    );
    assert!(err.to_string().contains("free"), "{err}");
}

#[tokio::test]
async fn a_throttling_registry_is_rate_limited() {
    let body = r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"You have reached your pull rate limit."}]}"#;
    let (url, _requests) = http_endpoint("429 Too Many Requests", body.into(), 8);
    let host = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let cache = tempfile::tempdir().unwrap();
    let mut opts = PullOptions::new(cache.path());
    // Written as a URL, as an operator might: still plain HTTP to that host.
    opts.insecure = vec![url.clone()];
    let puller = Puller::new(opts).unwrap();
    let err = puller
        .pull(
            &format!("{host}/library/busy:1"),
            &Credentials::Anonymous,
            &|_| {},
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PullError::RateLimited { registry, .. } if *registry == host),
        "{err:?}"
    );
    assert!(err.to_string().contains("rate-limiting"), "{err}");
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let cache = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut opts = PullOptions::new(cache.path());
    opts.insecure = vec![format!("127.0.0.1:{port}")];
    let puller = Puller::new(opts).unwrap();
    let err = puller
        .pull(
            &format!("127.0.0.1:{port}/x:1"),
            &Credentials::Anonymous,
            &|_| {},
        )
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::Unreachable { .. }), "{err:?}");
}

#[tokio::test]
async fn an_htpasswd_registry_over_tls_takes_right_credentials_only() {
    if !have_registry(true) {
        return;
    }
    let reg = Registry::start_with(Some(("alice", "s3cret")));
    reg.push("private/app", "1", &tiny_image("amd64", "private"))
        .await;
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(options(cache.path(), &reg)).unwrap();
    let reference = format!("{}/private/app:1", reg.host());
    let right = Credentials::Basic {
        username: "alice".into(),
        password: "s3cret".into(),
    };
    let image = puller.pull(&reference, &right, &|_| {}).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    unpack(&image, root.path()).unwrap();
    assert_eq!(
        std::fs::read_to_string(root.path().join("marker")).unwrap(),
        "private"
    );

    let wrong = Credentials::Basic {
        username: "alice".into(),
        password: "wrong".into(),
    };
    // A fresh cache each time: the blobs cached above must not hide a refusal.
    for (creds, wording) in [
        (wrong, "is wrong"),
        (Credentials::Anonymous, "none were given"),
    ] {
        let cache = tempfile::tempdir().unwrap();
        let puller = Puller::new(options(cache.path(), &reg)).unwrap();
        let err = puller.pull(&reference, &creds, &|_| {}).await.unwrap_err();
        let PullError::Unauthorized { registry, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(registry, &reg.host());
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "registry {} refused the credentials: ",
                reg.host()
            )) && text.contains(wording),
            "{text}"
        );
    }

    // Without the CA the registry's certificate is not trusted.
    let cache = tempfile::tempdir().unwrap();
    let mut opts = PullOptions::new(cache.path());
    opts.allow = vec![reg.host().parse().unwrap()];
    let puller = Puller::new(opts).unwrap();
    let err = puller.pull(&reference, &right, &|_| {}).await.unwrap_err();
    assert!(matches!(err, PullError::Unreachable { .. }), "{err:?}");
}

#[tokio::test]
async fn gcp_keys_are_sent_as_json_key_basic_auth() {
    if !have_registry(true) {
        return;
    }
    let json = r#"{"type":"service_account","project_id":"p"}"#;
    let reg = Registry::start_with(Some(("_json_key", json)));
    reg.push("gcp/app", "1", &tiny_image("amd64", "gcp")).await;
    let cache = tempfile::tempdir().unwrap();
    let puller = Puller::new(options(cache.path(), &reg)).unwrap();
    let creds = Credentials::Gcp {
        service_account_json: json.into(),
    };
    puller
        .pull(&format!("{}/gcp/app:1", reg.host()), &creds, &|_| {})
        .await
        .unwrap();
}

#[test]
fn a_ca_file_without_certificates_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("empty.pem");
    std::fs::write(&ca, "not a certificate\n").unwrap();
    let mut opts = PullOptions::new(dir.path().join("cache"));
    opts.ca_files = vec![ca];
    let err = Puller::new(opts).unwrap_err();
    assert!(matches!(err, PullError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("empty.pem"), "{err}");
}

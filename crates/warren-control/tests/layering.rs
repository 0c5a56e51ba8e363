//! The domain crate must stay free of HTTP and SQL (house style §2): this fails the build's
//! tests as soon as one of those crates enters `warren-control`'s dependency tree.

use std::process::Command;

#[test]
fn no_http_or_sql_in_the_domain() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "warren-control",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    for line in tree.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        for banned in ["axum", "hyper", "rusqlite", "sqlx", "tonic", "reqwest"] {
            assert!(
                name != banned && !name.starts_with(&format!("{banned}-")),
                "warren-control depends on {name}"
            );
        }
    }
}

/// The services of the domain (docs/control-plane.md, "Services") and the files each is made
/// of. A service may use the crate's vocabulary and the services below it; never `Control`,
/// `Tenant` or the builder, which are built on top of them.
const SERVICES: &[(&str, &[&str])] = &[
    ("keys", &["keys.rs"]),
    ("audit", &["audit.rs", "audit_budget.rs", "guest.rs"]),
    ("secrets", &["secrets.rs"]),
    ("events", &["events.rs"]),
    ("webhooks", &["webhooks.rs"]),
    ("volumes", &["volumes.rs"]),
    ("networks", &["networks.rs"]),
    (
        "templates",
        &[
            "templates/mod.rs",
            "templates/builds.rs",
            "templates/disk.rs",
            "templates/port.rs",
            "templates/records.rs",
            "templates/tags.rs",
        ],
    ),
    (
        "sandboxes",
        &[
            "sandboxes/mod.rs",
            "sandboxes/create.rs",
            "sandboxes/expiry.rs",
            "sandboxes/fork.rs",
            "sandboxes/list.rs",
            "sandboxes/network.rs",
            "sandboxes/pause.rs",
            "sandboxes/recover.rs",
            "sandboxes/snapshots.rs",
            "usage.rs",
            "telemetry.rs",
        ],
    ),
];

/// Modules no service may reach: the façade, the scoped entry point and the builder.
const ABOVE_SERVICES: &[&str] = &["control", "tenant", "builder"];

/// `crate::<module>` paths a source file names.
fn crate_modules(source: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = source;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

/// The service a `crate::<module>` path belongs to: the one of that name, or the one made of
/// `<module>.rs` (so `crate::usage` is the sandboxes service).
fn service_of(module: &str) -> Option<&'static str> {
    let file = format!("{module}.rs");
    SERVICES
        .iter()
        .find(|(s, files)| *s == module || files.contains(&file.as_str()))
        .map(|(s, _)| *s)
}

#[test]
fn services_form_a_dag() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges: Vec<(&str, String)> = Vec::new();
    for (service, files) in SERVICES {
        for file in *files {
            let text = std::fs::read_to_string(src.join(file))
                .unwrap_or_else(|e| panic!("reading {file}: {e}"));
            for module in crate_modules(&text) {
                assert!(
                    !ABOVE_SERVICES.contains(&module.as_str()),
                    "{file} (service {service}) uses crate::{module}: services must not reach up"
                );
                match service_of(&module) {
                    Some(to) if to != *service => edges.push((service, to.to_string())),
                    _ => {}
                }
            }
        }
    }
    // Kahn's algorithm: every service must come off the graph, or a cycle remains.
    let mut left: Vec<&str> = SERVICES.iter().map(|(s, _)| *s).collect();
    while let Some(pos) = left.iter().position(|s| {
        !edges
            .iter()
            .any(|(from, to)| from == s && left.contains(&to.as_str()))
    }) {
        left.remove(pos);
    }
    assert!(
        left.is_empty(),
        "services that depend on each other in a circle: {left:?} (edges {edges:?})"
    );
}

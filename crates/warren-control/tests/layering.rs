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

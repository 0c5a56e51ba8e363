//! The agent layer: exactly one file, at the path every runtime expects, with modes that do not
//! change the image's directories when stacked above it with overlayfs.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::Scratch;
use warren_template::{create_agent_layer, ensure_agent_layer, AGENT_PATH_IN_GUEST};

#[test]
fn layer_holds_the_agent_at_its_guest_path() {
    let scratch = Scratch::new("agent-layer");
    let binary = scratch.path().join("warren-agent-build");
    fs::write(&binary, b"#!/bin/sh\necho agent\n").expect("write fake agent");
    fs::set_permissions(&binary, fs::Permissions::from_mode(0o600)).expect("chmod");

    let layer = scratch.path().join("layer");
    let returned = create_agent_layer(&binary, &layer).expect("create layer");
    assert_eq!(returned, layer);

    let agent = layer.join(AGENT_PATH_IN_GUEST.trim_start_matches('/'));
    assert_eq!(
        fs::read(&agent).expect("read agent"),
        b"#!/bin/sh\necho agent\n"
    );
    assert_eq!(
        fs::metadata(&agent).expect("stat").permissions().mode() & 0o7777,
        0o755
    );
    for dir in ["", "usr", "usr/local", "usr/local/bin"] {
        let meta = fs::metadata(layer.join(dir)).expect("stat dir");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755, "mode of /{dir}");
        if nix_is_root() {
            assert_eq!((meta.uid(), meta.gid()), (0, 0), "owner of /{dir}");
        }
    }
    // Nothing else in the layer: every extra file would shadow the image's.
    let mut entries: Vec<_> = walk(&layer);
    entries.sort();
    assert_eq!(
        entries,
        vec![
            "usr",
            "usr/local",
            "usr/local/bin",
            "usr/local/bin/warren-agent"
        ]
    );

    // Re-creating over an existing layer replaces the binary.
    fs::write(&binary, b"v2").expect("write v2");
    create_agent_layer(&binary, &layer).expect("recreate layer");
    assert_eq!(fs::read(&agent).expect("read agent"), b"v2");
}

#[test]
fn ensure_agent_layer_is_content_addressed() {
    let scratch = Scratch::new("agent-layer-cas");
    let binary = scratch.path().join("agent");
    fs::write(&binary, b"agent v1").expect("write");
    let data = scratch.path().join("data");

    let first = ensure_agent_layer(&binary, &data).expect("layer v1");
    let again = ensure_agent_layer(&binary, &data).expect("layer v1 again");
    assert_eq!(first, again, "same binary, same layer");
    assert!(first.starts_with(data.join("agent-layers")));

    fs::write(&binary, b"agent v2").expect("write");
    let second = ensure_agent_layer(&binary, &data).expect("layer v2");
    assert_ne!(first, second, "a new agent build gets a new layer");
    // The old layer is untouched: sandboxes started with it keep working.
    assert_eq!(
        fs::read(first.join("usr/local/bin/warren-agent")).expect("read"),
        b"agent v1"
    );
    assert_eq!(
        fs::read(second.join("usr/local/bin/warren-agent")).expect("read"),
        b"agent v2"
    );
}

#[test]
fn a_missing_binary_is_an_error_naming_it() {
    let scratch = Scratch::new("agent-layer-missing");
    let missing = scratch.path().join("no-such-agent");
    let err = create_agent_layer(&missing, &scratch.path().join("layer")).expect_err("must fail");
    assert!(err.to_string().contains("no-such-agent"), "{err}");
}

fn walk(root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            out.push(
                path.strip_prefix(root)
                    .expect("prefix")
                    .to_string_lossy()
                    .into_owned(),
            );
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    out
}

fn nix_is_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

//! `pack_layers`: an upper layer's changes (new files, whiteouts, opaque directories) over a
//! lower one come out of the packed image exactly as the sandbox saw them.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

fn prerequisites() -> bool {
    warren_testkit::require("root (overlay and erofs mounts)", warren_testkit::is_root())
        && warren_testkit::require(
            "mkfs.erofs (scripts/setup.sh installs erofs-utils)",
            warren_testkit::on_path("mkfs.erofs").is_some(),
        )
}

/// Lists every path under the image's root with its kind, by mounting it in a private
/// mount namespace.
fn listing(image: &Path) -> String {
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg(r#"m=$(mktemp -d) && mount -t erofs -o ro "$1" "$m" && cd "$m" && find . -mindepth 1 -printf '%p %y %m\n' | sort && for f in $(find . -type f | sort); do printf '%s=%s\n' "$f" "$(cat "$f")"; done"#)
        .arg("list")
        .arg(image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn upper_changes_win_over_the_lower_layer() {
    if !prerequisites() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    for d in [
        &lower.join("etc"),
        &lower.join("gone"),
        &lower.join("opaque"),
        &upper.join("opaque"),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(lower.join("etc/keep"), "lower").unwrap();
    std::fs::write(lower.join("etc/changed"), "lower").unwrap();
    std::fs::write(lower.join("removed"), "lower").unwrap();
    std::fs::write(lower.join("gone/inside"), "lower").unwrap();
    std::fs::write(lower.join("opaque/old"), "lower").unwrap();
    std::fs::create_dir_all(upper.join("etc")).unwrap();
    std::fs::write(upper.join("etc/changed"), "upper").unwrap();
    std::fs::write(upper.join("new"), "upper").unwrap();
    std::fs::set_permissions(upper.join("new"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::write(upper.join("opaque/fresh"), "upper").unwrap();
    // overlayfs's whiteouts (0:0 character devices) and opaque marker.
    for w in ["removed", "gone"] {
        nix::sys::stat::mknod(
            &upper.join(w),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o000),
            0,
        )
        .unwrap();
    }
    xattr_set(&upper.join("opaque"), "trusted.overlay.opaque", b"y");

    let image = dir.path().join("out.erofs");
    warren_template::pack_layers(&[&upper, &lower], &image).unwrap();
    let got = listing(&image);
    let want = "\
./etc d 755
./etc/changed f 644
./etc/keep f 644
./new f 750
./opaque d 755
./opaque/fresh f 644
./etc/changed=upper
./etc/keep=lower
./new=upper
./opaque/fresh=upper
";
    assert_eq!(got, want);
}

fn xattr_set(path: &Path, name: &str, value: &[u8]) {
    let status = Command::new("setfattr")
        .args(["-n", name, "-v", std::str::from_utf8(value).unwrap()])
        .arg(path)
        .status();
    match status {
        Ok(s) if s.success() => {}
        _ => {
            // No setfattr: write it with python3 (always on our hosts), which calls setxattr.
            let s = Command::new("python3")
                .args([
                    "-c",
                    "import os,sys; os.setxattr(sys.argv[1], sys.argv[2], sys.argv[3].encode())",
                ])
                .arg(path)
                .arg(name)
                .arg(std::str::from_utf8(value).unwrap())
                .status()
                .unwrap();
            assert!(s.success(), "setxattr {name}");
        }
    }
}

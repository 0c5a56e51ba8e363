//! Builds the real `base` template image from Debian's archive and checks what is inside.
//!
//! Needs root, network access to deb.debian.org, `mmdebstrap` and `erofs-utils` (installed by
//! scripts/setup.sh); takes one to two minutes. Without root or the tools it prints `SKIP:` and why
//! (`WARREN_REQUIRE_ALL=1` makes that a failure).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{require_tools, Scratch};
use warren_template::{
    cached_image, ensure_image, verify_image, BuildPhase, BuildProgress, Recipe,
    AGENT_PATH_IN_GUEST, IMAGE_FILE, MANIFEST_FILE,
};

/// Records phases and keeps the log, echoing phases to stderr so a slow build is visible
/// with `--nocapture`.
#[derive(Default)]
struct Recorder {
    phases: Vec<BuildPhase>,
    lines: usize,
}

impl BuildProgress for Recorder {
    fn phase(&mut self, phase: BuildPhase, detail: &str) {
        eprintln!("[build_base] {phase}: {detail}");
        self.phases.push(phase);
    }
    fn log(&mut self, _line: &str) {
        self.lines += 1;
    }
}

/// Unmounts on drop, so a failed assertion never leaves the image mounted under the scratch
/// directory.
struct Mounted(PathBuf);

impl Mounted {
    fn new(image: &Path, target: &Path) -> Mounted {
        fs::create_dir_all(target).expect("create mount point");
        // erofs mounts straight from a regular file on current kernels; older ones need loop.
        let direct = Command::new("mount")
            .args(["-t", "erofs", "-o", "ro"])
            .arg(image)
            .arg(target)
            .output()
            .expect("run mount");
        if !direct.status.success() {
            let looped = Command::new("mount")
                .args(["-t", "erofs", "-o", "loop,ro"])
                .arg(image)
                .arg(target)
                .output()
                .expect("run mount");
            assert!(
                looped.status.success(),
                "mounting {} failed: direct: {} / loop: {}",
                image.display(),
                String::from_utf8_lossy(&direct.stderr),
                String::from_utf8_lossy(&looped.stderr)
            );
        }
        Mounted(target.to_owned())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Resolves `path` inside the image rooted at `root`, following symlinks the way the guest
/// would: an absolute target such as `/usr/sbin/ip -> /bin/ip` stays inside the image instead
/// of escaping to the host's /bin.
fn resolve_in(root: &Path, path: &str) -> PathBuf {
    let mut pending: Vec<String> = path
        .split('/')
        .filter(|p| !p.is_empty())
        .rev()
        .map(str::to_owned)
        .collect();
    let mut current: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        match part.as_str() {
            "." => continue,
            ".." => {
                current.pop();
                continue;
            }
            _ => {}
        }
        let candidate = root.join(current.join("/")).join(&part);
        match fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() => {
                hops += 1;
                assert!(hops < 40, "symlink loop resolving {path}");
                let target = fs::read_link(&candidate).expect("readlink");
                if target.is_absolute() {
                    current.clear();
                }
                let parts: Vec<String> = target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                        Component::ParentDir => Some("..".to_owned()),
                        _ => None,
                    })
                    .collect();
                pending.extend(parts.into_iter().rev());
            }
            _ => current.push(part),
        }
    }
    root.join(current.join("/"))
}

fn read(root: &Path, path: &str) -> String {
    let resolved = resolve_in(root, path);
    fs::read_to_string(&resolved).unwrap_or_else(|e| panic!("read {path} in the image: {e}"))
}

/// Runs a command inside the image like a sandbox would, as `user_spec` ("0:0" or
/// "1000:1000"). The image is mounted read-only and deliberately has an empty /dev, so this
/// gives it what every runtime provides: a private mount namespace with a tmpfs /dev holding
/// the basic nodes, and /proc. Everything mounted here vanishes with the namespace.
fn run_in_image(root: &Path, user_spec: &str, args: &[&str]) -> String {
    const SETUP: &str = r#"set -e
root=$0; spec=$1; shift
mount -t tmpfs -o mode=755,nosuid dev "$root/dev"
node() { mknod -m 666 "$root/dev/$1" c "$2" "$3"; }
node null 1 3; node zero 1 5; node full 1 7; node random 1 8; node urandom 1 9; node tty 5 0
mount -t proc proc "$root/proc"
exec chroot --userspec="$spec" "$root" "$@""#;
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "bash",
            "-c",
            SETUP,
        ])
        .arg(root)
        .arg(user_spec)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("LANG", "C.UTF-8")
        .env(
            "HOME",
            if user_spec == "0:0" {
                "/root"
            } else {
                "/home/user"
            },
        )
        .output()
        .expect("run unshare");
    assert!(
        out.status.success(),
        "{args:?} as {user_spec} in the image failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn base_image_builds_once_and_has_what_sandboxes_need() {
    if !require_tools(
        "build of the base image",
        &[
            ("mmdebstrap", "mmdebstrap"),
            ("mkfs.erofs", "erofs-utils"),
            ("mount", "mount"),
        ],
    ) {
        return;
    }
    if !warren_testkit::require(
        "root to build the base image (mmdebstrap --mode=root)",
        warren_testkit::is_root(),
    ) {
        return;
    }
    let scratch = Scratch::new("base");
    let data = scratch.path().join("data");
    let recipe = Recipe::base();

    // First use: a full build with visible phases.
    let mut first_progress = Recorder::default();
    let started = Instant::now();
    let image = ensure_image(&recipe, &data, &mut first_progress).unwrap_or_else(|e| panic!("{e}"));
    let build_time = started.elapsed();
    assert!(image.built);
    for phase in [
        BuildPhase::Bootstrap,
        BuildPhase::Configure,
        BuildPhase::MakeImage,
        BuildPhase::Commit,
    ] {
        assert!(
            first_progress.phases.contains(&phase),
            "no {phase} phase in {:?}",
            first_progress.phases
        );
    }
    assert!(
        first_progress.lines > 0,
        "command output reaches the progress log"
    );

    assert_eq!(image.dir, data.join("images").join(recipe.cache_key()));
    assert_eq!(image.image, image.dir.join(IMAGE_FILE));
    assert!(image.image.is_file(), "{} exists", image.image.display());
    assert!(image.dir.join(MANIFEST_FILE).is_file(), "manifest exists");
    let info = verify_image(&image.image).expect("the built image verifies");
    assert_eq!(image.manifest.recipe_hash, recipe.hash());
    assert_eq!(image.manifest.image_size, info.file_size);
    assert_eq!(
        fs::metadata(&image.image)
            .expect("stat")
            .permissions()
            .mode()
            & 0o777,
        0o444
    );
    image.verify_digest().expect("digest matches the manifest");
    for package in [
        "python3",
        "python-is-python3",
        "nodejs",
        "npm",
        "git",
        "curl",
        "sudo",
        "iproute2",
    ] {
        assert!(
            image
                .manifest
                .installed_packages
                .iter()
                .any(|p| p.starts_with(&format!("{package}="))),
            "manifest lists {package}"
        );
    }
    // Nothing but the finished entry and the lock is left behind.
    let mut leftovers: Vec<String> = fs::read_dir(data.join("images"))
        .expect("list images")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    leftovers.sort();
    assert_eq!(
        leftovers,
        vec![recipe.cache_key(), format!("{}.lock", recipe.cache_key())]
    );
    eprintln!(
        "[build_base] built {} in {:.1}s: {} MiB ({} packages)",
        recipe.cache_key(),
        build_time.as_secs_f64(),
        info.file_size >> 20,
        image.manifest.installed_packages.len()
    );

    // Second use: the cached image, instantly, without a single build phase.
    let mut second_progress = Recorder::default();
    let started = Instant::now();
    let again = ensure_image(&recipe, &data, &mut second_progress).expect("reuse");
    let reuse_time = started.elapsed();
    assert!(!again.built, "second ensure_image must not build");
    assert!(
        second_progress.phases.is_empty(),
        "reuse reported phases: {:?}",
        second_progress.phases
    );
    assert_eq!(again.image, image.image);
    assert_eq!(again.manifest, image.manifest);
    eprintln!(
        "[build_base] cache hit in {:.3} ms",
        reuse_time.as_secs_f64() * 1000.0
    );

    {
        let mnt = scratch.path().join("mnt");
        let _mounted = Mounted::new(&image.image, &mnt);
        check_contents(&mnt);
    }

    // A damaged cache entry is no longer offered (ensure_image would rebuild it).
    let mut perms = fs::metadata(&image.image).expect("stat").permissions();
    perms.set_mode(0o644);
    fs::set_permissions(&image.image, perms).expect("chmod");
    fs::write(&image.image, b"not an erofs image").expect("damage image");
    assert!(cached_image(&recipe, &data).expect("lookup").is_none());
}

fn check_contents(root: &Path) {
    for tool in [
        "/usr/bin/python3",
        "/usr/bin/node",
        "/usr/bin/git",
        "/usr/bin/sudo",
        "/usr/bin/npm",
        "/usr/bin/pip3",
        "/usr/bin/curl",
        "/usr/bin/ps",
        "/usr/sbin/ip",
        "/bin/bash",
    ] {
        let resolved = resolve_in(root, tool);
        let meta = fs::metadata(&resolved)
            .unwrap_or_else(|e| panic!("{tool} missing from the image: {e}"));
        assert!(
            meta.is_file() && meta.permissions().mode() & 0o111 != 0,
            "{tool} is executable"
        );
    }
    let sudo = fs::metadata(resolve_in(root, "/usr/bin/sudo")).expect("stat sudo");
    assert_eq!(sudo.uid(), 0);
    assert!(
        sudo.permissions().mode() & 0o4000 != 0,
        "sudo keeps its setuid bit in erofs"
    );

    let passwd = read(root, "/etc/passwd");
    let user: Vec<&str> = passwd
        .lines()
        .find(|l| l.starts_with("user:x:1000:1000:"))
        .unwrap_or_else(|| panic!("no user:x:1000:1000 in /etc/passwd:\n{passwd}"))
        .split(':')
        .collect();
    assert_eq!((user[5], user[6]), ("/home/user", "/bin/bash"));
    assert!(
        passwd.lines().any(|l| l.starts_with("root:x:0:0:")),
        "root is uid 0"
    );
    let group = read(root, "/etc/group");
    assert!(
        group.lines().any(|l| l.starts_with("user:x:1000:")),
        "group user is gid 1000"
    );
    let sudo_group = group
        .lines()
        .find(|l| l.starts_with("sudo:"))
        .expect("sudo group");
    assert!(
        sudo_group
            .rsplit(':')
            .next()
            .is_some_and(|m| m.split(',').any(|u| u == "user")),
        "{sudo_group}"
    );
    assert!(
        read(root, "/etc/shadow")
            .lines()
            .any(|l| l.starts_with("user:")),
        "user in /etc/shadow"
    );
    let home = fs::metadata(root.join("home/user")).expect("/home/user exists");
    assert_eq!((home.uid(), home.gid()), (1000, 1000));
    assert!(
        root.join("home/user/.bashrc").is_file(),
        "home populated from /etc/skel"
    );

    let mut grants = Vec::new();
    for entry in fs::read_dir(root.join("etc/sudoers.d")).expect("list /etc/sudoers.d") {
        let path = entry.expect("entry").path();
        let meta = fs::metadata(&path).expect("stat");
        let text = fs::read_to_string(&path).expect("read sudoers file");
        if text.lines().any(|l| {
            !l.trim_start().starts_with('#') && l.contains("user") && l.contains("NOPASSWD")
        }) {
            assert_eq!(meta.uid(), 0, "{} owned by root", path.display());
            assert_eq!(
                meta.permissions().mode() & 0o777,
                0o440,
                "{} is 0440",
                path.display()
            );
            grants.push(path);
        }
    }
    assert!(
        !grants.is_empty(),
        "a file in /etc/sudoers.d grants user NOPASSWD"
    );

    let resolv = fs::symlink_metadata(root.join("etc/resolv.conf")).expect("/etc/resolv.conf");
    assert!(
        resolv.is_file(),
        "resolv.conf is a regular file the runtime can replace"
    );
    assert!(
        !read(root, "/etc/resolv.conf").contains("nameserver"),
        "no host DNS baked in"
    );
    assert_eq!(read(root, "/etc/hostname"), "warren\n");
    assert!(read(root, "/etc/hosts").contains("localhost"));
    assert!(read(root, "/etc/nsswitch.conf")
        .lines()
        .any(|l| l.starts_with("hosts:") && l.contains("myhostname")));
    assert!(read(root, "/etc/default/locale").contains("LANG=C.UTF-8"));
    assert!(
        root.join("usr/lib/locale/C.utf8").is_dir(),
        "C.UTF-8 is built into libc"
    );

    // Small: no apt lists or downloaded packages, no man pages; copyright notices kept.
    let lists: Vec<_> = fs::read_dir(root.join("var/lib/apt/lists"))
        .expect("list apt lists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lock" && n != "partial")
        .collect();
    assert!(lists.is_empty(), "apt lists left in the image: {lists:?}");
    let debs = fs::read_dir(root.join("var/cache/apt/archives"))
        .expect("list apt archives")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".deb"))
        })
        .count();
    assert_eq!(debs, 0, "downloaded .debs left in the image");
    assert!(
        fs::read_dir(root.join("usr/share/man"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "man pages"
    );
    assert!(
        root.join("usr/share/doc/bash/copyright").is_file(),
        "copyright notices are kept"
    );
    assert_eq!(
        fs::read_dir(root.join("dev")).expect("list /dev").count(),
        0,
        "/dev is left to the runtime"
    );
    assert!(
        fs::symlink_metadata(root.join(AGENT_PATH_IN_GUEST.trim_start_matches('/'))).is_err(),
        "the agent is a separate layer, not baked into the image"
    );

    // The binaries run (their libraries are all there), the accounts resolve, and `user`
    // really gets root through sudo without a password.
    let python = [
        "python3",
        "-c",
        "import sys, venv, ensurepip; print(sys.version)",
    ];
    assert!(run_in_image(root, "1000:1000", &python).starts_with("3."));
    assert!(run_in_image(root, "1000:1000", &["node", "--version"]).starts_with('v'));
    assert!(run_in_image(root, "1000:1000", &["git", "--version"]).starts_with("git version"));
    assert!(run_in_image(root, "0:0", &["id", "user"]).contains("27(sudo)"));
    run_in_image(root, "0:0", &["visudo", "-c"]);
    assert_eq!(
        run_in_image(root, "1000:1000", &["sudo", "-n", "id", "-u"]),
        "0"
    );
}

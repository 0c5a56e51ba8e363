//! Templates that start from a registry image (`fromImage`): the image is pulled through the
//! shared layer cache (`warren-oci`), unpacked, made fit for Warren's runtimes, and packed into
//! an erofs image of its own, keyed by the manifest's digest. The build's steps then run on it
//! exactly as on any other parent template.
//!
//! The image needs nothing of ours: the agent is injected by the runtime (a statically linked
//! build runs on any libc), and the runtime supplies `/dev`, `/proc`, the hostname and DNS. What
//! the image's config says a container starts with becomes the build's defaults: `Env` the
//! build environment (so RUN finds the image's tools), `WorkingDir` the workdir, and
//! `Entrypoint`/`Cmd` the start command when the template sets none.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use warren_control::{BuildFailure, BuildLog, RegistryAuth};
use warren_oci::{Credentials, PulledImage, Puller};

use crate::{failure, hex, random_hex, Builder};

/// Salt of a pulled image's key: bump it when what is done to a pulled tree changes.
const PULL_FORMAT: &str = "warren-build pulled image v1";

/// What a pulled image's config gives the build.
#[derive(Debug, Clone, Default)]
pub(crate) struct ImageDefaults {
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    /// `Entrypoint` + `Cmd`, shell-quoted, if the image has either.
    pub start_cmd: Option<String>,
}

fn credentials(auth: Option<&RegistryAuth>) -> Credentials {
    match auth {
        None => Credentials::Anonymous,
        Some(RegistryAuth::Basic { username, password }) => Credentials::Basic {
            username: username.clone(),
            password: password.clone(),
        },
        Some(RegistryAuth::Aws {
            access_key_id,
            secret_access_key,
            region,
        }) => Credentials::Aws {
            access_key_id: access_key_id.clone(),
            secret_access_key: secret_access_key.clone(),
            region: region.clone(),
        },
        Some(RegistryAuth::Gcp {
            service_account_json,
        }) => Credentials::Gcp {
            service_account_json: service_account_json.clone(),
        },
    }
}

/// The image key of a pulled manifest (a built template's key: `b` + 24 hex digits).
fn pulled_key(manifest_digest: &str) -> String {
    let digest = Sha256::digest(format!("{PULL_FORMAT}\0{manifest_digest}").as_bytes());
    format!("b{}", &hex(&digest)[..24])
}

/// An error and its causes, one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

fn defaults_of(image: &PulledImage) -> ImageDefaults {
    let c = &image.config;
    let argv: Vec<&str> = c
        .entrypoint
        .iter()
        .chain(c.cmd.iter())
        .map(String::as_str)
        .collect();
    // A shell alone (`CMD ["bash"]`) is an interactive prompt in Docker: nothing to start.
    let shell_only = argv.len() == 1
        && matches!(
            argv[0].rsplit('/').next(),
            Some("sh" | "bash" | "ash" | "dash" | "zsh")
        );
    let start_cmd = (!argv.is_empty() && !shell_only).then(|| {
        argv.iter()
            .map(|a| {
                shlex::try_quote(a)
                    .map(|q| q.into_owned())
                    .unwrap_or_else(|_| "''".into())
            })
            .collect::<Vec<_>>()
            .join(" ")
    });
    ImageDefaults {
        env: c.env.iter().cloned().collect(),
        workdir: c.working_dir.clone().filter(|w| !w.is_empty()),
        start_cmd,
    }
}

/// Makes an unpacked image tree fit for the runtimes: `/etc/resolv.conf`, `/etc/hostname` and
/// `/etc/hosts` regular files (a runtime binds or writes its own over them; a symlink into
/// `/run` would point nowhere), and the mount points the runtimes use as real directories.
///
/// The tree is a registry image's, and this runs as root: its symlinks (`tmp -> /etc/shadow`,
/// `usr -> /etc`) mean the image's own paths inside a sandbox but the host's to a plain path
/// call, so every change goes through [`warren_oci::ImageTree`], which resolves paths inside
/// the tree and never follows the last component.
pub(crate) fn fit_for_runtimes(root: &Path) -> std::io::Result<()> {
    let tree = warren_oci::ImageTree::open(root)?;
    // A symlinked /etc is replaced: the files below must be the image's own.
    tree.real_dir(Path::new("etc"), None)?;
    for (name, content) in [
        ("etc/resolv.conf", "# written by the sandbox runtime\n"),
        ("etc/hostname", "warren\n"),
        ("etc/hosts", "127.0.0.1 localhost\n::1 localhost\n"),
    ] {
        tree.ensure_file(Path::new(name), content.as_bytes(), 0o644)?;
    }
    // Mounted over by the runtimes: a symlink here would send the mount elsewhere.
    for dir in ["dev", "proc", "sys", "run"] {
        tree.real_dir(Path::new(dir), None)?;
    }
    tree.real_dir(Path::new("tmp"), Some(0o1777))?;
    // Followed inside the image, as the sandbox would (`/root` may be a link to a home).
    for dir in ["root", "usr/local/bin"] {
        tree.dir_all(Path::new(dir))?;
    }
    Ok(())
}

fn has_bash(root: &Path) -> bool {
    ["bin/bash", "usr/bin/bash"]
        .iter()
        .any(|p| root.join(p).symlink_metadata().is_ok())
}

impl Builder {
    /// The image key of registry image `reference`, pulled and packed unless an image of the
    /// same manifest is already here, and the defaults its config gives the build.
    pub(crate) async fn pulled_base(
        &self,
        reference: &str,
        auth: Option<&RegistryAuth>,
        log: &BuildLog,
    ) -> Result<(String, ImageDefaults), BuildFailure> {
        let puller: Arc<Puller> = match &self.puller {
            Ok(p) => p.clone(),
            Err(e) => {
                return Err(failure(
                    "base",
                    format!("pulling images is not available on this server: {e}"),
                ))
            }
        };
        log.info(Some("base"), format!("[base] FROM image {reference}"));
        let sink = log.clone();
        let progress = move |line: String| sink.info(Some("base"), line);
        let image = puller
            .pull(reference, &credentials(auth), &progress)
            .await
            .map_err(|e| failure("base", format!("fromImage '{reference}': {}", chain(&e))))?;
        let key = pulled_key(&image.manifest_digest);
        let defaults = defaults_of(&image);
        let present = warren_template::built_template(&self.config.data_dir, &key)
            .ok()
            .flatten()
            .is_some();
        if present {
            log.info(
                Some("base"),
                format!(
                    "CACHED image {} ({})",
                    image.reference, image.manifest_digest
                ),
            );
            return Ok((key, defaults));
        }
        log.info(
            Some("base"),
            format!(
                "Unpacking {} layer(s) of {} ({})",
                image.layers.len(),
                image.reference,
                image.manifest_digest
            ),
        );
        let data = self.config.data_dir.clone();
        let staging =
            warren_template::images_dir(&data).join(format!(".pull-{key}-{}", random_hex(8)));
        let (k, st) = (key.clone(), staging.clone());
        let user = image.config.user.clone();
        let done = tokio::task::spawn_blocking(move || -> Result<u64, String> {
            let root = st.join("rootfs");
            std::fs::create_dir_all(&root)
                .map_err(|e| format!("create {}: {e}", root.display()))?;
            let bytes = warren_oci::unpack(&image, &root).map_err(|e| chain(&e))?;
            fit_for_runtimes(&root).map_err(|e| format!("preparing the image tree: {e}"))?;
            let shell = if has_bash(&root) {
                vec!["/bin/bash".into(), "-l".into(), "-c".into()]
            } else {
                vec!["/bin/sh".into(), "-c".into()]
            };
            let out = st.join(warren_template::IMAGE_FILE);
            warren_template::pack_layers(&[root.as_path()], &out).map_err(|e| e.to_string())?;
            std::fs::remove_dir_all(&root).map_err(|e| format!("remove the unpacked tree: {e}"))?;
            let config = warren_template::BuiltConfig {
                user: user
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| "root".into()),
                workdir: None,
                start_cmd: None,
                ready_cmd: None,
                start_env: BTreeMap::new(),
                shell,
                parent: String::new(),
            };
            warren_template::commit_built(&data, &k, &st, &config).map_err(|e| e.to_string())?;
            Ok(bytes)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match done {
            Ok(bytes) => {
                log.info(
                    Some("base"),
                    format!(
                        "Image {key} ready ({:.1} MiB unpacked)",
                        bytes as f64 / 1048576.0
                    ),
                );
                Ok((key, defaults))
            }
            Err(m) => {
                let _ = tokio::fs::remove_dir_all(&staging).await;
                Err(failure("base", format!("fromImage '{reference}': {m}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_with_symlinked_etc_files_gets_regular_ones_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink(
            "/run/systemd/resolve/stub-resolv.conf",
            root.join("etc/resolv.conf"),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("etc/hosts")).unwrap();
        fit_for_runtimes(root).unwrap();
        for f in ["resolv.conf", "hostname", "hosts"] {
            let m = root.join("etc").join(f).symlink_metadata().unwrap();
            assert!(m.file_type().is_file(), "{f}");
        }
        assert!(root.join("tmp").is_dir() && root.join("dev").is_dir());
        // The host's files were not touched through the links.
        assert!(std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .contains("root:"));
    }

    /// An image whose links name host paths: `tmp` a host file, `usr` and `run` host
    /// directories, `etc/hosts` a host file. The host's side stays exactly as it was.
    #[test]
    fn symlinks_in_the_image_never_lead_the_fix_ups_onto_the_host() {
        use std::os::unix::fs::{symlink, PermissionsExt as _};
        let host = tempfile::tempdir().unwrap();
        let canary = host.path().join("canary");
        std::fs::write(&canary, "secret").unwrap();
        std::fs::set_permissions(&canary, std::fs::Permissions::from_mode(0o600)).unwrap();
        let host_dir = host.path().join("dir");
        std::fs::create_dir(&host_dir).unwrap();
        let image = tempfile::tempdir().unwrap();
        let root = image.path();
        std::fs::create_dir(root.join("etc")).unwrap();
        symlink(&canary, root.join("tmp")).unwrap();
        symlink(&canary, root.join("etc/hosts")).unwrap();
        symlink(&host_dir, root.join("usr")).unwrap();
        symlink(&host_dir, root.join("run")).unwrap();
        symlink("../../../../../../..", root.join("root")).unwrap();

        fit_for_runtimes(root).unwrap();

        let mode = std::fs::metadata(&canary).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o600, "the host file's mode");
        assert_eq!(std::fs::read_to_string(&canary).unwrap(), "secret");
        assert_eq!(
            std::fs::read_dir(&host_dir).unwrap().count(),
            0,
            "nothing made in the host directory"
        );
        let tmp = root.join("tmp").symlink_metadata().unwrap();
        assert!(tmp.is_dir(), "tmp is a real directory now");
        assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777);
        assert!(root.join("run").symlink_metadata().unwrap().is_dir());
        assert!(root.join("etc/hosts").symlink_metadata().unwrap().is_file());
        // `usr` still names the host path, but inside the image: its bin is made there.
        let inside = root.join(host_dir.strip_prefix("/").unwrap());
        assert!(inside.join("local/bin").is_dir(), "{}", inside.display());
    }

    #[test]
    fn keys_follow_the_manifest_and_look_built() {
        let a = pulled_key("sha256:aa");
        assert!(warren_template::is_built_key(&a), "{a}");
        assert_ne!(a, pulled_key("sha256:bb"));
    }
}

//! What each step does in the build sandbox (`e2b-compat-wave2.md` §1.9), with the running
//! context (user, working directory, environment) steps pass along.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use warren_control::{BuildLog, StepKind};

use crate::files::FileStore;
use crate::sandbox::{BuildBox, Stream};

/// Where a build stands between steps. Cached with each step's layer, so a build resumed from
/// the cache continues with the same context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Context {
    pub user: String,
    pub workdir: Option<String>,
    pub env: BTreeMap<String, String>,
    /// The shell RUN uses: `/bin/bash -l -c`, or `/bin/sh -c` in images without bash.
    pub shell: Vec<String>,
}

/// Directories a RUN's `PATH` always ends with, so a `PATH` set by ENV still finds the
/// system's tools (as upstream does).
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn q(s: &str) -> String {
    shlex::try_quote(s)
        .map(|c| c.into_owned())
        .unwrap_or_else(|_| "''".into())
}

/// `path` resolved against `base` and normalised (`..` cannot climb above `/`).
pub(crate) fn resolve(base: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        Path::new(base).join(path)
    };
    let mut parts: Vec<String> = Vec::new();
    for c in joined.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    format!("/{}", parts.join("/"))
}

/// The part of a COPY source before its first glob character: the directory (or file)
/// inside the uploaded archive that the step copies from.
pub(crate) fn static_prefix(src: &str) -> String {
    let mut out = Vec::new();
    for part in src.split('/') {
        if part.contains(['*', '?', '[', '{']) {
            break;
        }
        if !part.is_empty() && part != "." {
            out.push(part);
        }
    }
    out.join("/")
}

/// Runs steps in a build sandbox; every failure is the message the SDK shows.
pub(crate) struct Runner<'a> {
    pub sandbox: &'a BuildBox,
    pub files: &'a FileStore,
    /// The server's data directory (finished images, for `COPY --from`).
    pub data_dir: &'a Path,
    pub team: &'a str,
    pub log: &'a BuildLog,
}

impl Runner<'_> {
    /// The default-user phase (step `base`): the image gets a `user` account with
    /// password-less sudo where it has the tools for it, and builds continue as that user.
    pub(crate) async fn base_phase(&self) -> Result<Context, String> {
        let has_bash = self
            .sandbox
            .root_script("test -x /bin/bash && echo yes || echo no")
            .await?;
        let shell = if has_bash.trim() == "yes" {
            vec!["/bin/bash".into(), "-l".into(), "-c".into()]
        } else {
            vec!["/bin/sh".into(), "-c".into()]
        };
        let script = r#"
if ! id -u user >/dev/null 2>&1; then
  if command -v useradd >/dev/null 2>&1; then
    useradd --create-home --shell "$(command -v bash || echo /bin/sh)" user
  elif command -v adduser >/dev/null 2>&1 && adduser --help 2>&1 | grep -q -- '-D'; then
    mkdir -p /home
    adduser -D -s "$(command -v bash || echo /bin/sh)" user >/dev/null 2>&1
  fi
  if ! id -u user >/dev/null 2>&1 && [ -w /etc/passwd ]; then
    # No account tools in the image: the account files by hand (uid/gid 1000 if free).
    uid=1000; while cut -d: -f3 /etc/passwd | grep -qx "$uid"; do uid=$((uid+1)); done
    echo "user:x:$uid:$uid::/home/user:$(command -v bash || echo /bin/sh)" >> /etc/passwd
    echo "user:x:$uid:" >> /etc/group
    [ -f /etc/shadow ] && echo "user::19000:0:99999:7:::" >> /etc/shadow
    mkdir -p /home/user && chown "$uid:$uid" /home/user && chmod 0755 /home/user
  fi
  passwd -d user >/dev/null 2>&1 || true
  if [ -d /etc/sudoers.d ]; then
    echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/90-warren-user
    chmod 0440 /etc/sudoers.d/90-warren-user
  fi
  for g in sudo wheel; do getent group $g >/dev/null 2>&1 && usermod -aG $g user 2>/dev/null; done
fi
id -u user >/dev/null 2>&1 && echo user || echo root
"#;
        let out = self.sandbox.root_script(script).await?;
        // The verdict is the script's last line; tools above it may have printed warnings.
        let user = out.lines().rev().map(str::trim).find(|l| !l.is_empty());
        Ok(Context {
            user: user.unwrap_or("root").to_string(),
            workdir: None,
            env: BTreeMap::new(),
            shell,
        })
    }

    /// Runs one step, updating `ctx`; `label` prefixes its output lines in the log.
    pub(crate) async fn step(
        &self,
        kind: &StepKind,
        ctx: &mut Context,
        label: &str,
        step: &str,
    ) -> Result<(), String> {
        match kind {
            StepKind::Run { command, user } => {
                let user = user.as_deref().unwrap_or(&ctx.user);
                self.run(command, user, ctx, label, step).await
            }
            StepKind::Env(pairs) => {
                for (k, v) in pairs {
                    let value = self.expand(v, ctx).await?;
                    ctx.env.insert(k.clone(), value);
                }
                Ok(())
            }
            StepKind::Workdir(path) => {
                let p = resolve(ctx.workdir.as_deref().unwrap_or("/"), path);
                let script = format!(
                    "p={p}; d=\"$p\"; top=; while [ ! -e \"$d\" ]; do top=\"$d\"; d=$(dirname \"$d\"); done; \
                     mkdir -p \"$p\" && if [ -n \"$top\" ]; then chown -R {u}: \"$top\"; fi && cd \"$p\" && pwd",
                    p = q(&p),
                    u = q(&ctx.user),
                );
                let out = self.sandbox.root_script(&script).await?;
                ctx.workdir = Some(out.trim().to_string()).filter(|s| !s.is_empty());
                Ok(())
            }
            StepKind::User(name) => {
                let script = format!(
                    "id -u {u} >/dev/null 2>&1 || useradd --create-home --shell \"$(command -v bash || echo /bin/sh)\" {u} \
                     || adduser -D {u}",
                    u = q(name)
                );
                self.sandbox
                    .root_script(&script)
                    .await
                    .map_err(|e| format!("failed to create user '{name}': {e}"))?;
                ctx.user = name.clone();
                Ok(())
            }
            StepKind::Copy {
                src,
                dest,
                owner,
                mode,
                files_hash,
            } => {
                self.copy(src, dest, owner.as_deref(), *mode, files_hash, ctx)
                    .await
            }
            StepKind::CopyGlob {
                pattern,
                dest,
                owner,
                mode,
                files_hash,
            } => {
                self.copy_glob(pattern, dest, owner.as_deref(), *mode, files_hash, ctx)
                    .await
            }
            StepKind::CopyFrom {
                from,
                srcs,
                dest,
                owner,
                mode,
            } => {
                let warren_control::CopyOrigin::Image(key) = from else {
                    return Err("COPY --from: the stage was not built first".into());
                };
                self.copy_from_image(key, srcs, dest, owner.as_deref(), *mode, ctx)
                    .await
            }
        }
    }

    async fn run(
        &self,
        command: &str,
        user: &str,
        ctx: &Context,
        label: &str,
        step: &str,
    ) -> Result<(), String> {
        let mut argv = ctx.shell.clone();
        argv.push(command.to_string());
        let mut env = ctx.env.clone();
        if let Some(path) = env.get_mut("PATH") {
            path.push(':');
            path.push_str(SYSTEM_PATH);
        }
        let log = self.log;
        let done = self
            .sandbox
            .run(
                &argv,
                user,
                ctx.workdir.as_deref(),
                &env,
                |s: Stream, line| {
                    let level = match s {
                        Stream::Stdout => warren_control::LogLevel::Info,
                        Stream::Stderr => warren_control::LogLevel::Warn,
                    };
                    log.push(
                        level,
                        Some(step),
                        format!("{label} [{}]: {line}", s.label()),
                    );
                },
            )
            .await
            .map_err(|e| format!("failed to run command '{command}': command failed: {e}"))?;
        if done.exit_code != 0 {
            return Err(format!(
                "failed to run command '{command}': command failed: exit status {}",
                done.exit_code
            ));
        }
        Ok(())
    }

    /// Shell-expands an ENV value against the build's environment so far (Docker's reading;
    /// `$(...)` and backticks stay literal).
    async fn expand(&self, value: &str, ctx: &Context) -> Result<String, String> {
        if !value.contains(['$', '\\', '"', '`']) {
            return Ok(value.to_string());
        }
        let escaped = value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('`', "\\`")
            .replace("$(", "\\$(");
        let mut argv = ctx.shell.clone();
        argv.push(format!("printf '%s' \"{escaped}\""));
        let mut out = String::new();
        let mut first = true;
        let done = self
            .sandbox
            .run(&argv, "root", Some("/"), &ctx.env, |s, line| {
                if s == Stream::Stdout {
                    if !first {
                        out.push('\n');
                    }
                    out.push_str(line);
                    first = false;
                }
            })
            .await?;
        if done.exit_code != 0 {
            return Err(format!("failed to expand {value:?}: {}", done.tail.trim()));
        }
        Ok(out)
    }

    /// Docker's COPY semantics: a file goes to `dest` (or into `dest/`), a directory (or the
    /// files a glob matched) is merged into `dest`; links stay links; the copied entries get
    /// the owner (default: the build's user) and mode.
    async fn copy(
        &self,
        src: &str,
        dest: &str,
        owner: Option<&str>,
        mode: Option<u32>,
        hash: &str,
        ctx: &Context,
    ) -> Result<(), String> {
        let archive = self.files.path(self.team, hash);
        if !archive.is_file() {
            return Err(format!("the files of COPY {src} were never uploaded"));
        }
        self.copy_archive(&archive, hash, src, dest, owner, mode, ctx)
            .await
    }

    /// A wildcard source of a Dockerfile's COPY: every path of the context it matches, each
    /// copied as a source of its own (Docker's rules: a file into `dest`, a directory's
    /// contents merged into it).
    async fn copy_glob(
        &self,
        pattern: &str,
        dest: &str,
        owner: Option<&str>,
        mode: Option<u32>,
        hash: &str,
        ctx: &Context,
    ) -> Result<(), String> {
        let archive = self.files.path(self.team, hash);
        if !archive.is_file() {
            return Err(format!("the files of COPY {pattern} were never uploaded"));
        }
        let (a, p) = (archive.clone(), pattern.to_string());
        let matched = tokio::task::spawn_blocking(move || crate::glob::matching_entries(&a, &p))
            .await
            .map_err(|e| e.to_string())??;
        if matched.is_empty() {
            return Err(format!("COPY {pattern}: no file in the context matches"));
        }
        if matched.len() > 1 && !dest.ends_with('/') {
            return Err(format!(
                "COPY {pattern}: {} files match, so the destination {dest:?} must be a directory ending in /",
                matched.len()
            ));
        }
        for m in &matched {
            self.copy_archive(&archive, hash, m, dest, owner, mode, ctx)
                .await?;
        }
        Ok(())
    }

    /// `COPY --from`: each source packed out of the stage's finished image on the host, then
    /// copied in as COPY copies an upload (the source's path in the tar is its prefix).
    async fn copy_from_image(
        &self,
        key: &str,
        srcs: &[String],
        dest: &str,
        owner: Option<&str>,
        mode: Option<u32>,
        ctx: &Context,
    ) -> Result<(), String> {
        let image = warren_template::built_template(self.data_dir, key)
            .map_err(|e| format!("COPY --from: the stage's image {key}: {e}"))?
            .ok_or_else(|| format!("COPY --from: the stage's image {key} is gone"))?
            .image;
        let id = crate::random_hex(16);
        let work = self.data_dir.join("build-tmp").join(&id);
        let (w, list) = (work.clone(), srcs.to_vec());
        let tars = tokio::task::spawn_blocking(move || {
            crate::stage_files::pack_from_image(&image, &list, &w)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        let result = async {
            for (src, tar) in srcs.iter().zip(tars?) {
                let name = crate::stage_files::archive_name(src);
                let prefix = if name == "." { String::new() } else { name };
                self.copy_archive(&tar, &id, &prefix, dest, owner, mode, ctx)
                    .await
                    .map_err(|e| format!("COPY --from: {e}"))?;
            }
            Ok(())
        }
        .await;
        let _ = tokio::fs::remove_dir_all(&work).await;
        result
    }

    /// Copies `src` (a path or glob, read up to its first glob character) out of the tar
    /// `archive` on the host into the sandbox, with Docker's COPY rules.
    #[allow(clippy::too_many_arguments)]
    async fn copy_archive(
        &self,
        archive: &Path,
        tag: &str,
        src: &str,
        dest: &str,
        owner: Option<&str>,
        mode: Option<u32>,
        ctx: &Context,
    ) -> Result<(), String> {
        let staging = format!("/tmp/.warren-copy-{tag}");
        self.sandbox
            .upload(archive, &format!("{staging}.tar"))
            .await?;
        let (user, group) = match owner.unwrap_or(&ctx.user).split_once(':') {
            Some((u, g)) => (u.to_string(), Some(g.to_string())),
            None => (owner.unwrap_or(&ctx.user).to_string(), None),
        };
        let group = match group {
            Some(g) => q(&g),
            None => format!("\"$(id -gn {u} 2>/dev/null || echo {u})\"", u = q(&user)),
        };
        let mode_arg = mode.map(|m| format!("--mode={m:o}")).unwrap_or_default();
        let prefix = static_prefix(src);
        let script = format!(
            r#"set -e
t={t}
rm -rf "$t"; mkdir -p "$t"
tar -xf "$t.tar" -C "$t" --no-same-owner
src="$t/{prefix}"
home=$(getent passwd {u} | cut -d: -f6)
case {dest} in /*) dest={dest} ;; *) dest="${{WORKDIR:-${{home:-/}}}}/"{dest} ;; esac
grp={group}
pack() {{ tar -cf - --owner={u} --group="$grp" {mode} --null -T - ; }}
if [ -d "$src" ] && [ ! -L "$src" ]; then
  # A directory the copy creates belongs to the copy's owner, as its contents do.
  if [ ! -e "$dest" ]; then mkdir -p "$dest"; chown {u}:"$grp" "$dest"; fi
  (cd "$src" && find . -mindepth 1 -maxdepth 1 -print0 | pack) | (cd "$dest" && tar -xf - )
else
  case "$dest" in
    */) mkdir -p "$dest"; into="$dest" ;;
    *) if [ -d "$dest" ] && [ ! -L "$dest" ]; then into="$dest/"; else mkdir -p "$(dirname "$dest")"; into=; fi ;;
  esac
  base=$(basename "$src")
  if [ -n "$into" ]; then
    (cd "$(dirname "$src")" && printf '%s\0' "$base" | pack) | (cd "$into" && tar -xf -)
  else
    tmp="$t.one"; rm -rf "$tmp"; mkdir -p "$tmp"
    (cd "$(dirname "$src")" && printf '%s\0' "$base" | pack) | (cd "$tmp" && tar -xf -)
    rm -rf "$dest"; mv "$tmp/$base" "$dest"; rm -rf "$tmp"
  fi
fi
rm -rf "$t" "$t.tar"
"#,
            t = q(&staging),
            prefix = prefix.replace('"', "\\\""),
            u = q(&user),
            dest = q(dest),
            group = group,
            mode = mode_arg,
        );
        let script = match &ctx.workdir {
            Some(w) => format!("WORKDIR={}\n{script}", q(w)),
            None => script,
        };
        self.sandbox
            .root_script(&script)
            .await
            .map(|_| ())
            .map_err(|e| format!("failed to copy {src} to {dest}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_like_a_shell_cd() {
        assert_eq!(resolve("/", "app"), "/app");
        assert_eq!(resolve("/home/user", "../x/./y"), "/home/x/y");
        assert_eq!(resolve("/a", "/b/c"), "/b/c");
        assert_eq!(resolve("/", "../../.."), "/");
    }

    #[test]
    fn copy_sources_start_at_their_static_prefix() {
        assert_eq!(static_prefix("folder/*"), "folder");
        assert_eq!(static_prefix("app.py"), "app.py");
        assert_eq!(static_prefix("*.txt"), "");
        assert_eq!(static_prefix("a/**/b.txt"), "a");
        assert_eq!(static_prefix("./src/"), "src");
    }
}

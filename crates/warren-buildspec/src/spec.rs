//! What a template build asks for: its source and its steps, validated before anything runs.
//!
//! The E2B SDKs turn every builder call (and a Dockerfile, parsed on the client) into five step
//! types: `COPY`, `ENV`, `RUN`, `WORKDIR` and `USER` (`ADD` and `ARG` are accepted as their
//! synonyms, as upstream does). A malformed step is refused with its 1-based number, so the
//! SDK's traceback points at the builder call that made it.

use crate::SpecError;

/// Where a build starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildSource {
    /// Another template (a catalog one such as `base`, or one built here), by name or id.
    Template(String),
    /// An OCI image reference (`e2bdev/base` is Warren's `base`).
    Image {
        reference: String,
        registry: Option<RegistryAuth>,
    },
}

/// Credentials for a private registry, in the shapes the SDKs send.
#[derive(Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    Basic {
        username: String,
        password: String,
    },
    Aws {
        access_key_id: String,
        secret_access_key: String,
        region: String,
    },
    Gcp {
        service_account_json: String,
    },
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Credentials: never in debug output or logs.
        f.write_str(match self {
            RegistryAuth::Basic { .. } => "RegistryAuth::Basic(..)",
            RegistryAuth::Aws { .. } => "RegistryAuth::Aws(..)",
            RegistryAuth::Gcp { .. } => "RegistryAuth::Gcp(..)",
        })
    }
}

/// One step of a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub kind: StepKind,
    /// Skip the cache for this step (and so for every later one).
    pub force: bool,
    /// The Dockerfile line the step came from, when the server parsed one (failures name it).
    pub line: Option<usize>,
}

/// Where `COPY --from` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyOrigin {
    /// An earlier stage of the build, by its index in [`BuildSpec::stages`].
    Stage(usize),
    /// A finished image, by its key (what the builder turns a stage into before it runs, so
    /// the step's cache key changes with the stage's content).
    Image(String),
}

/// A stage of a multi-stage Dockerfile that a later one copies from: built first, as an
/// image no template names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageSpec {
    /// `AS name`, or the stage's index, for logs.
    pub name: String,
    pub source: BuildSource,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    /// Files uploaded under `files_hash` (a tar), from `src` (a path or glob relative to the
    /// client's context) to `dest`, owned by `owner` (`user[:group]`), with `mode` if set.
    Copy {
        src: String,
        dest: String,
        owner: Option<String>,
        mode: Option<u32>,
        files_hash: String,
    },
    /// Pairs merged into the build environment; values are shell-expanded.
    Env(Vec<(String, String)>),
    /// A shell command, as `user` when set (else the build's current user).
    Run {
        command: String,
        user: Option<String>,
    },
    Workdir(String),
    User(String),
    /// Every path of the uploaded context (a tar, `files_hash`) that `pattern` matches, each
    /// copied as COPY copies one source: Docker's wildcard sources (Dockerfiles only). The
    /// pattern is matched segment by segment (`*`, `?` and `[...]` never cross `/`).
    CopyGlob {
        pattern: String,
        dest: String,
        owner: Option<String>,
        mode: Option<u32>,
        files_hash: String,
    },
    /// Paths out of another stage's finished image (absolute there; `.` is its root) to
    /// `dest`, with COPY's rules for owner, mode and destination.
    CopyFrom {
        from: CopyOrigin,
        srcs: Vec<String>,
        dest: String,
        owner: Option<String>,
        mode: Option<u32>,
    },
}

impl StepKind {
    /// The wire name, for logs and cache keys.
    pub fn name(&self) -> &'static str {
        match self {
            StepKind::Copy { .. } => "COPY",
            StepKind::Env(_) => "ENV",
            StepKind::Run { .. } => "RUN",
            StepKind::Workdir(_) => "WORKDIR",
            StepKind::User(_) => "USER",
            StepKind::CopyFrom { .. } | StepKind::CopyGlob { .. } => "COPY",
        }
    }

    /// The step's arguments joined by spaces, as build logs show them.
    pub fn describe(&self) -> String {
        match self {
            StepKind::Copy { src, dest, .. } => format!("{src} {dest}"),
            StepKind::Env(pairs) => pairs
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            StepKind::Run { command, user } => match user {
                Some(u) => format!("{command} (as {u})"),
                None => command.clone(),
            },
            StepKind::Workdir(p) | StepKind::User(p) => p.clone(),
            StepKind::CopyGlob { pattern, dest, .. } => format!("{pattern} {dest}"),
            StepKind::CopyFrom {
                from, srcs, dest, ..
            } => {
                let from = match from {
                    CopyOrigin::Stage(i) => format!("stage {i}"),
                    CopyOrigin::Image(k) => k.clone(),
                };
                format!("--from={from} {} {dest}", srcs.join(" "))
            }
        }
    }
}

/// A whole build request, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildSpec {
    pub source: BuildSource,
    pub steps: Vec<Step>,
    /// Rebuild everything, ignoring the cache.
    pub force: bool,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// Stages built before this one, which `COPY --from` steps read (Dockerfiles only).
    pub stages: Vec<StageSpec>,
    /// Lines for the build log before it starts (what a Dockerfile had that was ignored).
    pub notes: Vec<String>,
}

/// A step as it came over the wire.
#[derive(Debug, Clone, Default)]
pub struct RawStep {
    pub kind: String,
    pub args: Vec<String>,
    pub force: bool,
    pub files_hash: Option<String>,
}

/// Whether `hash` looks like the SDKs' files hash: SHA-256 as 64 lowercase hex digits.
pub fn is_files_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn step_error(n: usize, kind: &str, what: impl std::fmt::Display) -> SpecError {
    SpecError(format!("step {n} ({kind}): {what}"))
}

/// Environment variable names as POSIX shells accept them.
fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// A user or group name a build may switch to or chown to.
pub fn valid_account(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with('-')
}

impl RawStep {
    /// The step, or why it cannot run; `n` is its 1-based number.
    pub fn parse(self, n: usize) -> Result<Step, SpecError> {
        let kind = self.kind.trim().to_ascii_uppercase();
        let args = self.args;
        let no_nul = |s: &str| !s.contains('\0');
        if !args.iter().all(|a| no_nul(a)) {
            return Err(step_error(n, &kind, "arguments must not contain NUL bytes"));
        }
        let parsed = match kind.as_str() {
            "COPY" | "ADD" => {
                if args.len() < 2 || args.len() > 4 {
                    return Err(step_error(n, &kind, "expects [src, dest, owner?, mode?]"));
                }
                let Some(files_hash) = self.files_hash.filter(|h| !h.is_empty()) else {
                    return Err(step_error(n, &kind, "filesHash is required"));
                };
                if !is_files_hash(&files_hash) {
                    return Err(step_error(
                        n,
                        &kind,
                        "filesHash must be 64 lowercase hex digits",
                    ));
                }
                let (src, dest) = (args[0].clone(), args[1].clone());
                if src.is_empty() || dest.is_empty() {
                    return Err(step_error(n, &kind, "src and dest must not be empty"));
                }
                if src.starts_with('/') || src.split('/').any(|c| c == "..") {
                    return Err(step_error(
                        n,
                        &kind,
                        format!("src {src:?} must be relative and stay inside the context"),
                    ));
                }
                let owner = args.get(2).filter(|o| !o.is_empty()).cloned();
                if let Some(o) = &owner {
                    let mut parts = o.splitn(2, ':');
                    let ok = parts.all(valid_account);
                    if !ok {
                        return Err(step_error(n, &kind, format!("invalid owner {o:?}")));
                    }
                }
                let mode = match args.get(3).filter(|m| !m.is_empty()) {
                    None => None,
                    Some(m) => match u32::from_str_radix(m, 8) {
                        Ok(v) if v <= 0o7777 => Some(v),
                        _ => return Err(step_error(n, &kind, format!("invalid mode {m:?}"))),
                    },
                };
                StepKind::Copy {
                    src,
                    dest,
                    owner,
                    mode,
                    files_hash,
                }
            }
            "ENV" | "ARG" => {
                // ARG may come as a single name (no default): an empty value, as Docker.
                let args = if kind == "ARG" && args.len() == 1 {
                    vec![args[0].clone(), String::new()]
                } else {
                    args
                };
                if args.is_empty() || !args.len().is_multiple_of(2) {
                    return Err(step_error(n, &kind, "expects key/value pairs"));
                }
                let mut pairs = Vec::new();
                for kv in args.chunks(2) {
                    if !valid_env_name(&kv[0]) {
                        return Err(step_error(
                            n,
                            &kind,
                            format!("invalid variable name {:?}", kv[0]),
                        ));
                    }
                    pairs.push((kv[0].clone(), kv[1].clone()));
                }
                StepKind::Env(pairs)
            }
            "RUN" => {
                if args.is_empty() || args.len() > 2 || args[0].trim().is_empty() {
                    return Err(step_error(n, &kind, "expects [command, user?]"));
                }
                let user = args.get(1).filter(|u| !u.is_empty()).cloned();
                if let Some(u) = &user {
                    if !valid_account(u) {
                        return Err(step_error(n, &kind, format!("invalid username: '{u}'")));
                    }
                }
                StepKind::Run {
                    command: args[0].clone(),
                    user,
                }
            }
            "WORKDIR" => {
                if args.len() != 1 || args[0].is_empty() {
                    return Err(step_error(n, &kind, "expects [path]"));
                }
                StepKind::Workdir(args[0].clone())
            }
            "USER" => {
                if args.len() != 1 || !valid_account(&args[0]) {
                    return Err(step_error(n, &kind, "expects [username]"));
                }
                StepKind::User(args[0].clone())
            }
            "" => return Err(step_error(n, "?", "type is required")),
            other => {
                return Err(step_error(
                    n,
                    other,
                    "unknown step type (expected COPY, ENV, RUN, WORKDIR or USER)",
                ))
            }
        };
        Ok(Step {
            kind: parsed,
            force: self.force,
            line: None,
        })
    }
}

/// The image reference the SDKs' `from_base_image()` sends: Warren's `base` template.
pub const E2B_BASE_IMAGE: &str = "e2bdev/base";

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: &str, args: &[&str]) -> RawStep {
        RawStep {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            force: false,
            files_hash: None,
        }
    }

    #[test]
    fn steps_parse_with_their_synonyms() {
        let s = raw("run", &["echo hi"]).parse(1).unwrap();
        assert_eq!(
            s.kind,
            StepKind::Run {
                command: "echo hi".into(),
                user: None
            }
        );
        let s = raw("ARG", &["V"]).parse(2).unwrap();
        assert_eq!(s.kind, StepKind::Env(vec![("V".into(), String::new())]));
        let mut c = raw("ADD", &["a.txt", "b/", "app:app", "0644"]);
        c.files_hash = Some("a".repeat(64));
        let s = c.parse(3).unwrap();
        assert!(matches!(
            s.kind,
            StepKind::Copy {
                mode: Some(0o644),
                ..
            }
        ));
    }

    #[test]
    fn bad_steps_name_their_number_and_cause() {
        let cases = [
            (raw("FROB", &["x"]), "step 4 (FROB): unknown step type"),
            (raw("ENV", &["A"]), "step 4 (ENV): expects key/value pairs"),
            (raw("ENV", &["1A", "b"]), "invalid variable name"),
            (raw("RUN", &[]), "expects [command, user?]"),
            (raw("COPY", &["a", "b"]), "filesHash is required"),
            (raw("USER", &["bad name"]), "expects [username]"),
            (raw("", &[]), "type is required"),
        ];
        for (step, want) in cases {
            let err = step.parse(4).unwrap_err().to_string();
            assert!(err.contains(want), "{err} lacks {want}");
        }
        let mut c = raw("COPY", &["../etc", "/x"]);
        c.files_hash = Some("b".repeat(64));
        assert!(c
            .parse(1)
            .unwrap_err()
            .to_string()
            .contains("inside the context"));
        let mut c = raw("COPY", &["a", "/x"]);
        c.files_hash = Some("XYZ".into());
        assert!(c
            .parse(1)
            .unwrap_err()
            .to_string()
            .contains("64 lowercase hex"));
    }

    #[test]
    fn registry_credentials_never_print() {
        let a = RegistryAuth::Basic {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{a:?}").contains("hunter2"));
    }
}

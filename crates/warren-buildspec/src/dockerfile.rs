//! Dockerfiles built by the server: the text parsed into stages of instructions, with Docker's
//! line continuations, quoting and `$VAR` substitution, then turned into a [`BuildSpec`] whose
//! steps mean what the E2B SDK's client-side parser makes of the same file
//! (`e2b-compat-wave2.md` §1.6), so a Dockerfile gives the same template either way. Unlike
//! E2B, several stages are allowed: the ones `COPY --from` reads are built first as images of
//! their own ([`BuildSpec::stages`]).
//!
//! What each instruction does here:
//! - `FROM image [AS name]`: an image reference (`e2bdev/base` is Warren's `base`), or an
//!   earlier stage by name or index, whose steps the new stage then starts with (the layer
//!   cache makes the repeat free). `--platform` is ignored, `FROM scratch` refused (nothing
//!   to run steps with).
//! - `ARG`, `ENV`, `RUN`, `WORKDIR`, `USER`, `COPY`/`ADD` (local files): steps, as the SDK makes
//!   them. ARG takes the caller's build arguments over its default and becomes an ENV step
//!   (as the SDK's), ARGs before the first FROM serve FROM lines (and an ARG in a stage that
//!   names them without a default).
//! - `ENTRYPOINT` and `CMD`: the template's start command, combined as Docker does (exec forms
//!   are joined with shell quoting). `HEALTHCHECK CMD …`: the ready command (a create returns
//!   once it passes); `HEALTHCHECK NONE` clears it.
//! - Accepted and ignored, each with a note in the build log: `EXPOSE` (its ports are kept on
//!   the stage; every port of a sandbox is reachable anyway), `LABEL`, `MAINTAINER`, `VOLUME`
//!   (a sandbox's filesystem is all writable and kept), `STOPSIGNAL` (sandboxes are killed, not
//!   signalled), `RUN --mount=type=cache` (runs without the cache) and `RUN --network=default`.
//! - Refused with the line number, because ignoring them would change what the build makes:
//!   `SHELL`, `ONBUILD`, heredocs, `ADD` of URLs or archives (Docker unpacks those), `ADD
//!   --checksum`/`--keep-git-dir`, `COPY --link`/`--parents`/`--exclude`, glob sources, other
//!   `RUN` flags, `COPY --from=<image>`, unknown instructions.
//!
//! Pure: no I/O. [`parse`] reads the text, [`Dockerfile::to_build_spec`] makes the build.

use std::collections::HashMap;

use crate::spec::{valid_account, BuildSpec};

mod words;

use words::{split_words, Env, Subst};

/// Why a Dockerfile cannot be built, always with the 1-based line it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerfileError {
    /// An instruction or option this server does not build.
    #[error("Dockerfile line {line}: {what} is not supported{hint}")]
    Unsupported {
        line: usize,
        what: String,
        hint: String,
    },
    /// Malformed text (bad flags, arguments, quoting, substitution).
    #[error("Dockerfile line {line}: {message}")]
    Invalid { line: usize, message: String },
    /// `FROM` or `--from` naming a stage that is not earlier in the file.
    #[error("Dockerfile line {line}: no earlier stage named '{name}'")]
    UnknownStage { line: usize, name: String },
    /// The file has no `FROM` before its first step (or none at all).
    #[error("Dockerfile line {line}: expected FROM before this (a Dockerfile starts with FROM)")]
    NoFrom { line: usize },
}

impl DockerfileError {
    /// The 1-based line the error is about.
    pub fn line(&self) -> usize {
        match self {
            DockerfileError::Unsupported { line, .. }
            | DockerfileError::Invalid { line, .. }
            | DockerfileError::UnknownStage { line, .. }
            | DockerfileError::NoFrom { line } => *line,
        }
    }
}

fn invalid(line: usize, message: impl Into<String>) -> DockerfileError {
    DockerfileError::Invalid {
        line,
        message: message.into(),
    }
}

fn unsupported(line: usize, what: impl Into<String>, hint: &str) -> DockerfileError {
    DockerfileError::Unsupported {
        line,
        what: what.into(),
        hint: if hint.is_empty() {
            String::new()
        } else {
            format!(" ({hint})")
        },
    }
}

/// Where a stage starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    /// An image reference, after ARG substitution.
    Image(String),
    /// An earlier stage, by its index.
    Stage(usize),
}

/// A start command as written: exec form (JSON) or shell form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Exec(Vec<String>),
    Shell(String),
}

impl Command {
    fn argv(&self) -> Vec<String> {
        match self {
            Command::Exec(v) => v.clone(),
            Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
        }
    }

    /// As one shell command line.
    fn line(&self) -> String {
        match self {
            Command::Exec(v) => join_quoted(v),
            Command::Shell(s) => s.clone(),
        }
    }
}

/// One instruction that makes a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instr {
    Run(String),
    Env(Vec<(String, String)>),
    /// Build arguments in scope from here, with their values (override, else default).
    Arg(Vec<(String, String)>),
    Workdir(String),
    User(String),
    Copy {
        srcs: Vec<String>,
        dest: String,
        owner: Option<String>,
        mode: Option<u32>,
        /// `--from=<stage>`: the stage's index.
        from: Option<usize>,
    },
}

/// One `FROM` and what follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// `AS name`, lowercased as Docker compares them.
    pub name: Option<String>,
    pub from: From,
    /// The line of the `FROM`.
    pub line: usize,
    /// The instructions that make steps, with their lines.
    pub steps: Vec<(usize, Instr)>,
    pub entrypoint: Option<Command>,
    pub cmd: Option<Command>,
    /// `HEALTHCHECK CMD`, as a shell command line.
    pub healthcheck: Option<String>,
    /// `EXPOSE`d ports as written (`8080`, `53/udp`).
    pub exposed: Vec<String>,
    /// ENV values in effect at the end (inherited by a stage `FROM` this one).
    env: Env,
    /// Whether the CMD was inherited from the stage this one starts from: an ENTRYPOINT
    /// here then clears it, as in Docker.
    cmd_inherited: bool,
}

impl Stage {
    /// The start command Docker would run: ENTRYPOINT and CMD combined.
    pub fn start_cmd(&self) -> Option<String> {
        match (&self.entrypoint, &self.cmd) {
            (Some(Command::Shell(s)), _) => Some(s.clone()),
            (Some(Command::Exec(ep)), cmd) => {
                let mut argv = ep.clone();
                if let Some(c) = cmd {
                    argv.extend(c.argv());
                }
                (!argv.is_empty()).then(|| join_quoted(&argv))
            }
            (None, Some(c)) => Some(c.line()).filter(|l| !l.trim().is_empty()),
            (None, None) => None,
        }
    }
}

/// A parsed Dockerfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    pub stages: Vec<Stage>,
    /// Instructions accepted but ignored, for the build log.
    pub notes: Vec<(usize, String)>,
}

/// One instruction after continuations are joined: its first line, keyword and the rest.
struct Logical {
    line: usize,
    keyword: String,
    rest: String,
}

/// Joins continuation lines, drops comments and empty lines, reads the `# escape=` directive.
fn logical_lines(text: &str) -> Result<(Vec<Logical>, char), DockerfileError> {
    let mut escape = '\\';
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    // Parser directives: `# name=value` lines at the very top only.
    while i < lines.len() {
        let t = lines[i].trim();
        let Some(body) = t.strip_prefix('#') else {
            break;
        };
        let Some((k, v)) = body.split_once('=') else {
            break;
        };
        let k = k.trim().to_ascii_lowercase();
        if k.contains(char::is_whitespace) || k.is_empty() {
            break;
        }
        if k == "escape" {
            escape = match v.trim() {
                "\\" => '\\',
                "`" => '`',
                other => {
                    return Err(invalid(
                        i + 1,
                        format!("invalid escape directive {other:?}"),
                    ))
                }
            };
        }
        i += 1;
    }
    let mut out = Vec::new();
    while i < lines.len() {
        let t = lines[i].trim_start();
        if t.is_empty() || t.starts_with('#') {
            i += 1;
            continue;
        }
        let start = i;
        let mut joined = String::new();
        let mut first = true;
        loop {
            let raw = lines[i].trim_end();
            let blank = raw.trim().is_empty() || raw.trim_start().starts_with('#');
            if !first && blank {
                // Comment and empty lines inside a continued instruction are skipped, as Docker does.
            } else if let Some(body) = raw.strip_suffix(escape) {
                joined.push_str(body);
            } else {
                joined.push_str(raw);
                i += 1;
                break;
            }
            first = false;
            i += 1;
            if i == lines.len() {
                break;
            }
        }
        let joined = joined.trim();
        let (kw, rest) = match joined.split_once(char::is_whitespace) {
            Some((k, r)) => (k, r.trim()),
            None => (joined, ""),
        };
        out.push(Logical {
            line: start + 1,
            keyword: kw.to_ascii_uppercase(),
            rest: rest.to_string(),
        });
    }
    Ok((out, escape))
}

/// `--name=value` (or `--name`) options at the start of `rest`, and what follows them.
fn take_flags(rest: &str) -> (Vec<(String, Option<String>)>, &str) {
    let mut flags = Vec::new();
    let mut rest = rest.trim_start();
    while let Some(body) = rest.strip_prefix("--") {
        let end = body.find(char::is_whitespace).unwrap_or(body.len());
        let flag = &body[..end];
        match flag.split_once('=') {
            Some((k, v)) => flags.push((k.to_ascii_lowercase(), Some(v.to_string()))),
            None => flags.push((flag.to_ascii_lowercase(), None)),
        }
        rest = body[end..].trim_start();
    }
    (flags, rest)
}

/// The exec (JSON array of strings) form, if `rest` is one.
fn exec_form(rest: &str) -> Option<Vec<String>> {
    let t = rest.trim();
    if !t.starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(t).ok()
}

/// A heredoc opener (`<<EOF`, `<<-EOF`, `<<"EOF"`) anywhere in the arguments.
fn has_heredoc(rest: &str) -> bool {
    rest.match_indices("<<").any(|(i, _)| {
        let after = rest[i + 2..].trim_start_matches('-');
        after
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '"' || c == '\'')
    })
}

/// Python's `shlex.quote`, as the SDK quotes exec-form arguments.
pub fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./-_".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\"'\"'"))
    }
}

fn join_quoted(argv: &[String]) -> String {
    argv.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

fn is_archive_name(path: &str) -> bool {
    let p = path.to_ascii_lowercase();
    [
        ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz", ".tar.zst",
    ]
    .iter()
    .any(|e| p.ends_with(e))
}

/// Parses a Dockerfile; `build_args` override ARG defaults (`--build-arg K=V`).
pub fn parse(
    text: &str,
    build_args: &HashMap<String, String>,
) -> Result<Dockerfile, DockerfileError> {
    let (lines, escape) = logical_lines(text)?;
    let mut p = Parser {
        escape,
        build_args,
        global: Env::default(),
        stages: Vec::new(),
        notes: Vec::new(),
        scope: Env::default(),
    };
    for l in &lines {
        p.instruction(l)?;
    }
    if p.stages.is_empty() {
        return Err(DockerfileError::NoFrom {
            line: lines.first().map_or(1, |l| l.line),
        });
    }
    Ok(Dockerfile {
        stages: p.stages,
        notes: p.notes,
    })
}

struct Parser<'a> {
    escape: char,
    build_args: &'a HashMap<String, String>,
    /// ARGs declared before the first FROM.
    global: Env,
    stages: Vec<Stage>,
    notes: Vec<(usize, String)>,
    /// What `$VAR` means in the current stage: its ARGs and ENVs.
    scope: Env,
}

impl Parser<'_> {
    fn words(&self, line: usize, rest: &str) -> Result<Vec<String>, DockerfileError> {
        split_words(rest, self.escape).map_err(|m| invalid(line, m))
    }

    /// A word with quotes removed and every `$VAR` substituted (unknown ones are empty).
    fn word(&self, line: usize, raw: &str) -> Result<String, DockerfileError> {
        words::process(raw, self.escape, &self.scope, Subst::All).map_err(|m| invalid(line, m))
    }

    /// The current stage: an instruction before the first FROM has none.
    fn stage(&mut self, line: usize) -> Result<&mut Stage, DockerfileError> {
        self.stages
            .last_mut()
            .ok_or(DockerfileError::NoFrom { line })
    }

    /// An earlier stage `COPY --from` names (the current one is not earlier: it would copy
    /// from itself before it exists).
    fn find_stage(&self, line: usize, name: &str) -> Result<Option<usize>, DockerfileError> {
        let lower = name.to_ascii_lowercase();
        let earlier = &self.stages[..self.stages.len().saturating_sub(1)];
        if let Some(i) = earlier
            .iter()
            .position(|s| s.name.as_deref() == Some(lower.as_str()))
        {
            return Ok(Some(i));
        }
        if self.stages.last().and_then(|s| s.name.as_deref()) == Some(lower.as_str()) {
            return Err(DockerfileError::UnknownStage {
                line,
                name: name.into(),
            });
        }
        if let Ok(i) = name.parse::<usize>() {
            return if i < earlier.len() {
                Ok(Some(i))
            } else {
                Err(DockerfileError::UnknownStage {
                    line,
                    name: name.into(),
                })
            };
        }
        Ok(None)
    }

    fn instruction(&mut self, l: &Logical) -> Result<(), DockerfileError> {
        let line = l.line;
        let kw = l.keyword.as_str();
        if matches!(kw, "RUN" | "COPY" | "ADD") && has_heredoc(&l.rest) {
            return Err(unsupported(
                line,
                format!("{kw} with a heredoc (<<EOF)"),
                "write the file with COPY, or the script with RUN lines",
            ));
        }
        match kw {
            "FROM" => self.from(line, &l.rest),
            "ARG" => self.arg(line, &l.rest),
            "ENV" => self.env(line, &l.rest),
            "RUN" => self.run(line, &l.rest),
            "COPY" | "ADD" => self.copy(line, kw, &l.rest),
            "WORKDIR" | "USER" => {
                // The rest of the line is one word, spaces and all (Docker's reading).
                let value = self.word(line, &l.rest)?;
                if value.is_empty() {
                    return Err(invalid(line, format!("{kw} is empty after substitution")));
                }
                let instr = if kw == "WORKDIR" {
                    Instr::Workdir(value)
                } else {
                    // `user:group`: the group is Docker's primary group for RUN; the SDK's USER
                    // takes a name only.
                    if value.contains(':') {
                        return Err(unsupported(
                            line,
                            "USER with a group",
                            "give the user name only",
                        ));
                    }
                    if !valid_account(&value) {
                        return Err(invalid(line, format!("invalid user name {value:?}")));
                    }
                    Instr::User(value)
                };
                self.stage(line)?.steps.push((line, instr));
                Ok(())
            }
            "CMD" | "ENTRYPOINT" | "HEALTHCHECK" => self.command(line, kw, &l.rest),
            "EXPOSE" => {
                let words = self.words(line, &l.rest)?;
                let mut ports = Vec::new();
                for w in &words {
                    let p = self.word(line, w)?;
                    let (num, proto) = p.split_once('/').unwrap_or((&p, "tcp"));
                    let ok_num = num
                        .split('-')
                        .all(|n| n.parse::<u16>().is_ok_and(|v| v > 0));
                    if !ok_num
                        || !matches!(proto.to_ascii_lowercase().as_str(), "tcp" | "udp" | "sctp")
                    {
                        return Err(invalid(line, format!("invalid port {p:?}")));
                    }
                    ports.push(p);
                }
                self.notes.push((
                    line,
                    format!(
                        "EXPOSE {}: noted; every port of a sandbox is reachable",
                        ports.join(" ")
                    ),
                ));
                self.stage(line)?.exposed.extend(ports);
                Ok(())
            }
            "LABEL" | "MAINTAINER" | "VOLUME" | "STOPSIGNAL" => {
                self.stage(line)?;
                let why = match kw {
                    "VOLUME" => "a sandbox's whole filesystem is writable and kept",
                    "STOPSIGNAL" => "sandboxes are stopped by the platform, not by a signal",
                    _ => "metadata",
                };
                self.notes.push((line, format!("{kw} ignored ({why})")));
                Ok(())
            }
            "SHELL" => Err(unsupported(
                line,
                "SHELL",
                "RUN uses bash -l -c, or /bin/sh -c without bash",
            )),
            "ONBUILD" => Err(unsupported(line, "ONBUILD", "")),
            other => Err(unsupported(line, format!("the instruction {other}"), "")),
        }
    }

    fn from(&mut self, line: usize, rest: &str) -> Result<(), DockerfileError> {
        let (flags, rest) = take_flags(rest);
        for (k, _) in &flags {
            if k != "platform" {
                return Err(unsupported(line, format!("FROM --{k}"), ""));
            }
        }
        let words = self.words(line, rest)?;
        let (image, name) = match words.as_slice() {
            [image] => (image, None),
            [image, as_, name] if as_.eq_ignore_ascii_case("as") => (image, Some(name)),
            _ => {
                return Err(invalid(
                    line,
                    "FROM expects an image and optionally AS <name>",
                ))
            }
        };
        // FROM sees only the global ARGs (and their overrides).
        let image = words::process(image, self.escape, &self.global, Subst::All)
            .map_err(|m| invalid(line, m))?;
        if image.is_empty() {
            return Err(invalid(line, "FROM names no image after substitution"));
        }
        if image.eq_ignore_ascii_case("scratch") {
            return Err(unsupported(
                line,
                "FROM scratch",
                "a build runs its steps with the image's shell",
            ));
        }
        let name = match name {
            None => None,
            Some(n) => {
                let n = n.to_ascii_lowercase();
                let ok = n.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
                if !ok {
                    return Err(invalid(line, format!("invalid stage name {n:?}")));
                }
                if self
                    .stages
                    .iter()
                    .any(|s| s.name.as_deref() == Some(n.as_str()))
                {
                    return Err(invalid(line, format!("duplicate stage name {n:?}")));
                }
                Some(n)
            }
        };
        // An earlier stage by name (never by index in FROM: `FROM 0` is an image in Docker).
        let parent = self
            .stages
            .iter()
            .position(|s| s.name.as_deref() == Some(image.to_ascii_lowercase().as_str()));
        let (from, env, entrypoint, cmd, healthcheck) = match parent {
            Some(i) => {
                let p = &self.stages[i];
                (
                    From::Stage(i),
                    p.env.clone(),
                    p.entrypoint.clone(),
                    p.cmd.clone(),
                    p.healthcheck.clone(),
                )
            }
            None => (From::Image(image), Env::default(), None, None, None),
        };
        self.scope = env.clone();
        self.stages.push(Stage {
            name,
            from,
            line,
            steps: Vec::new(),
            cmd_inherited: cmd.is_some(),
            entrypoint,
            cmd,
            healthcheck,
            exposed: Vec::new(),
            env,
        });
        Ok(())
    }

    fn arg(&mut self, line: usize, rest: &str) -> Result<(), DockerfileError> {
        let words = self.words(line, rest)?;
        if words.is_empty() {
            return Err(invalid(line, "ARG expects a name"));
        }
        let in_stage = !self.stages.is_empty();
        let mut pairs = Vec::new();
        for w in &words {
            let (name, default) = match w.split_once('=') {
                Some((n, d)) => (n.to_string(), Some(d)),
                None => (w.clone(), None),
            };
            if !words::valid_name(&name) {
                return Err(invalid(line, format!("invalid ARG name {name:?}")));
            }
            let scope = if in_stage { &self.scope } else { &self.global };
            let default = match default {
                Some(d) => Some(
                    words::process(d, self.escape, scope, Subst::All)
                        .map_err(|m| invalid(line, m))?,
                ),
                // In a stage, a bare ARG brings a global one's value into scope.
                None if in_stage => self.global.get(&name).map(str::to_string),
                None => None,
            };
            let value = self
                .build_args
                .get(&name)
                .cloned()
                .or(default)
                .unwrap_or_default();
            if in_stage {
                self.scope.set(&name, &value);
            } else {
                self.global.set(&name, &value);
            }
            pairs.push((name, value));
        }
        if in_stage {
            self.stage(line)?.steps.push((line, Instr::Arg(pairs)));
        }
        Ok(())
    }

    fn env(&mut self, line: usize, rest: &str) -> Result<(), DockerfileError> {
        self.stage(line)?;
        let words = self.words(line, rest)?;
        let mut raw_pairs: Vec<(String, String)> = Vec::new();
        match words.first() {
            None => return Err(invalid(line, "ENV expects name=value")),
            // The old form: `ENV name value with spaces`.
            Some(first) if !first.contains('=') => {
                let value = rest.trim_start()[first.len()..].trim();
                if value.is_empty() {
                    return Err(invalid(line, format!("ENV {first} has no value")));
                }
                raw_pairs.push((first.clone(), value.to_string()));
            }
            Some(_) => {
                for w in &words {
                    let Some((k, v)) = w.split_once('=') else {
                        return Err(invalid(line, format!("ENV expects name=value, got {w:?}")));
                    };
                    raw_pairs.push((k.to_string(), v.to_string()));
                }
            }
        }
        let mut pairs = Vec::new();
        for (k, v) in raw_pairs {
            if !words::valid_name(&k) {
                return Err(invalid(line, format!("invalid ENV name {k:?}")));
            }
            // Variables this file defines are substituted here; others (`$PATH`) are left
            // for the builder, which expands them against the image's environment.
            let value = words::process(&v, self.escape, &self.scope, Subst::KnownOnly)
                .map_err(|m| invalid(line, m))?;
            self.scope.set(&k, &value);
            pairs.push((k, value));
        }
        let stage = self.stage(line)?;
        for (k, v) in &pairs {
            stage.env.set(k, v);
        }
        stage.steps.push((line, Instr::Env(pairs)));
        Ok(())
    }
}

mod instrs;
mod spec;

/// A build request's Dockerfile as a [`BuildSpec`]; an error is the caller's (400), with the line.
pub fn dockerfile_build(
    text: &str,
    context_hash: Option<&str>,
    build_args: &HashMap<String, String>,
    force: bool,
) -> Result<BuildSpec, crate::SpecError> {
    parse(text, build_args)
        .and_then(|d| d.to_build_spec(context_hash, force))
        .map_err(|e| crate::SpecError(e.to_string()))
}

#[cfg(test)]
#[path = "dockerfile/tests.rs"]
mod tests;

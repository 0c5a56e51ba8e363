//! RUN, COPY/ADD and the commands (CMD, ENTRYPOINT, HEALTHCHECK): the instructions with
//! flags and exec forms.

use super::{
    exec_form, invalid, is_archive_name, join_quoted, take_flags, unsupported, Command,
    DockerfileError, Instr, Parser,
};
use crate::spec::valid_account;

impl Parser<'_> {
    pub(super) fn run(&mut self, line: usize, rest: &str) -> Result<(), DockerfileError> {
        let (flags, rest) = take_flags(rest);
        for (k, v) in &flags {
            let v = v.as_deref().unwrap_or("");
            let note = match k.as_str() {
                "mount" if v.split(',').any(|p| p == "type=cache") => {
                    "RUN --mount=type=cache: run without the cache"
                }
                "network" if v == "default" => "RUN --network=default: the build's network",
                _ => return Err(unsupported(line, format!("RUN --{k}"), "")),
            };
            self.notes.push((line, note.into()));
        }
        let command = match exec_form(rest) {
            Some(argv) if argv.is_empty() => return Err(invalid(line, "RUN [] runs nothing")),
            Some(argv) => join_quoted(&argv),
            None => rest.to_string(),
        };
        if command.trim().is_empty() {
            return Err(invalid(line, "RUN expects a command"));
        }
        self.stage(line)?.steps.push((line, Instr::Run(command)));
        Ok(())
    }

    pub(super) fn copy(
        &mut self,
        line: usize,
        kw: &str,
        rest: &str,
    ) -> Result<(), DockerfileError> {
        self.stage(line)?;
        let (flags, rest) = take_flags(rest);
        let (mut owner, mut mode, mut from) = (None, None, None);
        for (k, v) in flags {
            let value = |v: Option<String>| {
                v.filter(|v| !v.is_empty())
                    .ok_or_else(|| invalid(line, format!("{kw} --{k} needs a value")))
            };
            match k.as_str() {
                "chown" => {
                    let o = self.word(line, &value(v)?)?;
                    if !o.split(':').all(valid_account) || o.split(':').count() > 2 {
                        return Err(invalid(line, format!("invalid --chown {o:?}")));
                    }
                    owner = Some(o);
                }
                "chmod" => {
                    let m = value(v)?;
                    match u32::from_str_radix(&m, 8) {
                        Ok(v) if v <= 0o7777 => mode = Some(v),
                        _ => {
                            return Err(unsupported(
                                line,
                                format!("{kw} --chmod={m}"),
                                "give an octal mode such as 0644",
                            ))
                        }
                    }
                }
                "from" if kw == "COPY" => {
                    let name = self.word(line, &value(v)?)?;
                    match self.find_stage(line, &name)? {
                        Some(i) => from = Some(i),
                        None => return Err(unsupported(
                            line,
                            format!("COPY --from={name} (an image, not an earlier stage)"),
                            "copy from a stage: FROM <image> AS <name>, then COPY --from=<name>",
                        )),
                    }
                }
                other => return Err(unsupported(line, format!("{kw} --{other}"), "")),
            }
        }
        let args = match exec_form(rest) {
            Some(v) => v,
            None => self.words(line, rest)?,
        };
        if args.len() < 2 {
            return Err(invalid(
                line,
                format!("{kw} expects at least one source and a destination"),
            ));
        }
        let mut args = args
            .iter()
            .map(|a| self.word(line, a))
            .collect::<Result<Vec<_>, _>>()?;
        let dest = args.pop().unwrap_or_default();
        if dest.is_empty() {
            return Err(invalid(line, format!("{kw} destination is empty")));
        }
        if args.len() > 1 && !dest.ends_with('/') {
            return Err(invalid(
                line,
                format!("{kw} with several sources needs a destination ending in /"),
            ));
        }
        let mut srcs = Vec::new();
        for src in args {
            if kw == "ADD" && (src.contains("://") || src.starts_with("git@")) {
                return Err(unsupported(
                    line,
                    format!("ADD of a URL ({src})"),
                    "download it with RUN curl or wget",
                ));
            }
            if kw == "ADD" && is_archive_name(&src) {
                return Err(unsupported(
                    line,
                    format!("ADD of an archive ({src})"),
                    "COPY it and unpack it with RUN tar",
                ));
            }
            if from.is_some() && src.contains(['*', '?', '[']) {
                return Err(unsupported(
                    line,
                    format!("COPY --from with a wildcard source ({src})"),
                    "name the files or their directory",
                ));
            }
            // Sources are inside the context (or the stage's root for --from): a leading `/`
            // means its top, and nothing may climb out.
            let clean: Vec<&str> = src
                .split('/')
                .filter(|p| !p.is_empty() && *p != ".")
                .collect();
            if clean.contains(&"..") {
                return Err(invalid(
                    line,
                    format!("{kw} source {src:?} leaves the build context"),
                ));
            }
            let clean = clean.join("/");
            srcs.push(if clean.is_empty() {
                ".".to_string()
            } else {
                clean
            });
        }
        self.stage(line)?.steps.push((
            line,
            Instr::Copy {
                srcs,
                dest,
                owner,
                mode,
                from,
            },
        ));
        Ok(())
    }

    pub(super) fn command(
        &mut self,
        line: usize,
        kw: &str,
        rest: &str,
    ) -> Result<(), DockerfileError> {
        let mut rest = rest;
        if kw == "HEALTHCHECK" {
            let (flags, r) = take_flags(rest);
            for (k, _) in &flags {
                if !matches!(
                    k.as_str(),
                    "interval" | "timeout" | "start-period" | "start-interval" | "retries"
                ) {
                    return Err(unsupported(line, format!("HEALTHCHECK --{k}"), ""));
                }
            }
            let words = self.words(line, r)?;
            match words.first().map(|w| w.to_ascii_uppercase()) {
                Some(w) if w == "NONE" && words.len() == 1 => {
                    self.stage(line)?.healthcheck = None;
                    return Ok(());
                }
                Some(w) if w == "CMD" => rest = r.trim_start()[3..].trim_start(),
                _ => return Err(invalid(line, "HEALTHCHECK expects CMD <command> or NONE")),
            }
        }
        let c = match exec_form(rest) {
            Some(v) => Command::Exec(v),
            None => Command::Shell(rest.to_string()),
        };
        let stage = self.stage(line)?;
        match kw {
            "CMD" => {
                stage.cmd = Some(c);
                stage.cmd_inherited = false;
            }
            "ENTRYPOINT" => {
                stage.entrypoint = Some(c);
                if stage.cmd_inherited {
                    stage.cmd = None;
                    stage.cmd_inherited = false;
                }
            }
            _ => {
                let l = c.line();
                if l.trim().is_empty() {
                    return Err(invalid(line, "HEALTHCHECK CMD expects a command"));
                }
                stage.healthcheck = Some(l);
            }
        }
        Ok(())
    }
}

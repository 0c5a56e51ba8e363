//! A parsed Dockerfile as a build: the last stage's steps (after the steps of the stages it
//! starts `FROM`), the stages its `COPY --from` reads, and the start and ready commands.

use std::collections::BTreeSet;

use super::{invalid, Dockerfile, DockerfileError, From, Instr};
use crate::spec::{is_files_hash, BuildSource, BuildSpec, CopyOrigin, StageSpec, Step, StepKind};

impl Dockerfile {
    /// The instructions a stage runs, its own after those of the stages it starts from, and
    /// the image at the root of that chain.
    fn chain(&self, k: usize) -> (&str, Vec<(usize, &Instr)>) {
        let mut order = vec![k];
        let mut at = k;
        while let From::Stage(p) = self.stages[at].from {
            order.push(p);
            at = p;
        }
        let root = match &self.stages[at].from {
            From::Image(i) => i.as_str(),
            From::Stage(_) => unreachable!("the loop ends at an image"),
        };
        let instrs = order
            .iter()
            .rev()
            .flat_map(|&s| self.stages[s].steps.iter().map(|(l, i)| (*l, i)))
            .collect();
        (root, instrs)
    }

    /// The build: `context_hash` names the uploaded build context (one tar of it) that
    /// COPY and ADD read; `force` rebuilds without the cache.
    ///
    /// As the SDK's parser: steps run as `root` in `/` (Docker's defaults) and the template
    /// ends as `user` in `/home/user` unless the file set USER (or WORKDIR). The ready
    /// command is the HEALTHCHECK's, else none (the SDK's `sleep 20` would hold every create
    /// for 20 seconds here, where a create waits for it).
    pub fn to_build_spec(
        &self,
        context_hash: Option<&str>,
        force: bool,
    ) -> Result<BuildSpec, DockerfileError> {
        let last = self.stages.len() - 1;
        // The stages COPY --from reads, from the last one down: only those are built.
        let mut needed = BTreeSet::new();
        let mut todo = vec![last];
        while let Some(k) = todo.pop() {
            for (_, instr) in self.chain(k).1 {
                if let Instr::Copy { from: Some(j), .. } = instr {
                    if needed.insert(*j) {
                        todo.push(*j);
                    }
                }
            }
        }
        let index: Vec<usize> = needed.iter().copied().collect();
        let origin = |j: usize| CopyOrigin::Stage(index.iter().position(|&x| x == j).unwrap_or(0));
        let steps_of =
            |k: usize, final_stage: bool| -> Result<(BuildSource, Vec<Step>), DockerfileError> {
                let (root, instrs) = self.chain(k);
                let line0 = self.stages[k].line;
                let step = |line: usize, kind: StepKind| Step {
                    kind,
                    force: false,
                    line: Some(line),
                };
                let mut steps = vec![
                    step(line0, StepKind::User("root".into())),
                    step(line0, StepKind::Workdir("/".into())),
                ];
                let (mut set_user, mut set_workdir) = (false, false);
                for (line, instr) in instrs {
                    match instr {
                        Instr::Run(c) => steps.push(step(
                            line,
                            StepKind::Run {
                                command: c.clone(),
                                user: None,
                            },
                        )),
                        Instr::Env(pairs) | Instr::Arg(pairs) => {
                            steps.push(step(line, StepKind::Env(pairs.clone())))
                        }
                        Instr::Workdir(w) => {
                            set_workdir = true;
                            steps.push(step(line, StepKind::Workdir(w.clone())));
                        }
                        Instr::User(u) => {
                            set_user = true;
                            steps.push(step(line, StepKind::User(u.clone())));
                        }
                        Instr::Copy {
                            srcs,
                            dest,
                            owner,
                            mode,
                            from: Some(j),
                        } => steps.push(step(
                            line,
                            StepKind::CopyFrom {
                                from: origin(*j),
                                srcs: srcs.clone(),
                                dest: dest.clone(),
                                owner: owner.clone(),
                                mode: *mode,
                            },
                        )),
                        Instr::Copy {
                            srcs,
                            dest,
                            owner,
                            mode,
                            from: None,
                        } => {
                            let hash = context_hash.ok_or_else(|| {
                                invalid(
                                    line,
                                    "COPY needs the build context: upload it as one tar and give \
                                 its hash as contextFilesHash",
                                )
                            })?;
                            if !is_files_hash(hash) {
                                return Err(invalid(
                                    line,
                                    "contextFilesHash must be 64 lowercase hex digits",
                                ));
                            }
                            for src in srcs {
                                if src.contains(['*', '?', '[']) {
                                    steps.push(step(
                                        line,
                                        StepKind::CopyGlob {
                                            pattern: src.clone(),
                                            dest: dest.clone(),
                                            owner: owner.clone(),
                                            mode: *mode,
                                            files_hash: hash.to_string(),
                                        },
                                    ));
                                    continue;
                                }
                                steps.push(step(
                                    line,
                                    StepKind::Copy {
                                        src: src.clone(),
                                        dest: dest.clone(),
                                        owner: owner.clone(),
                                        mode: *mode,
                                        files_hash: hash.to_string(),
                                    },
                                ));
                            }
                        }
                    }
                }
                if final_stage {
                    let end = steps.last().and_then(|s| s.line).unwrap_or(line0);
                    if !set_user {
                        steps.push(step(end, StepKind::User("user".into())));
                    }
                    if !set_workdir {
                        steps.push(step(end, StepKind::Workdir("/home/user".into())));
                    }
                }
                let source = BuildSource::Image {
                    reference: root.to_string(),
                    registry: None,
                };
                Ok((source, steps))
            };
        let mut stages = Vec::new();
        for &j in &index {
            let (source, steps) = steps_of(j, false)?;
            stages.push(StageSpec {
                name: self.stages[j].name.clone().unwrap_or_else(|| j.to_string()),
                source,
                steps,
            });
        }
        let (source, steps) = steps_of(last, true)?;
        let stage = &self.stages[last];
        Ok(BuildSpec {
            source,
            steps,
            force,
            start_cmd: stage.start_cmd(),
            ready_cmd: stage.healthcheck.clone(),
            stages,
            notes: self
                .notes
                .iter()
                .map(|(l, n)| format!("Dockerfile line {l}: {n}"))
                .collect(),
        })
    }
}

use std::collections::HashMap;

use super::*;
use crate::spec::{BuildSource, CopyOrigin, StepKind};

const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn df(text: &str) -> Dockerfile {
    parse(text, &HashMap::new()).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn err(text: &str) -> DockerfileError {
    match parse(text, &HashMap::new()) {
        Ok(d) => panic!("parsed: {d:?}"),
        Err(e) => e,
    }
}

fn instrs(text: &str) -> Vec<Instr> {
    df(text)
        .stages
        .remove(0)
        .steps
        .into_iter()
        .map(|(_, i)| i)
        .collect()
}

fn kinds(text: &str) -> Vec<StepKind> {
    df(text)
        .to_build_spec(Some(HASH), false)
        .unwrap()
        .steps
        .into_iter()
        .map(|s| s.kind)
        .collect()
}

fn env(pairs: &[(&str, &str)]) -> Instr {
    Instr::Env(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[test]
fn continuations_comments_and_the_escape_directive() {
    let d = df("FROM e2bdev/base\n# a comment\n\nRUN echo a \\\n  # inside\n  && echo b\nRUN x");
    let s = &d.stages[0];
    assert_eq!(s.steps[0], (4, Instr::Run("echo a   && echo b".into())));
    assert_eq!(s.steps[1].0, 7);
    let d = df("# escape=`\nFROM e2bdev/base\nRUN echo a `\n b\nWORKDIR C:\\x");
    assert_eq!(d.stages[0].steps[0].1, Instr::Run("echo a  b".into()));
    assert_eq!(d.stages[0].steps[1].1, Instr::Workdir("C:\\x".into()));
    // A directive after the first instruction is a comment.
    let d = df("FROM e2bdev/base\n# escape=`\nRUN a \\\n b");
    assert_eq!(d.stages[0].steps[0].1, Instr::Run("a  b".into()));
}

#[test]
fn exec_and_shell_forms() {
    assert_eq!(
        instrs("FROM e2bdev/base\nRUN [\"echo\", \"x y\"]\nRUN echo $HOME")[..],
        [
            Instr::Run("echo 'x y'".into()),
            Instr::Run("echo $HOME".into())
        ]
    );
    // Not valid JSON: the shell form, as Docker reads it.
    assert_eq!(
        instrs("FROM a\nRUN [not json")[0],
        Instr::Run("[not json".into())
    );
}

#[test]
fn args_env_and_substitution() {
    let text = "ARG TAG=1\nFROM img:${TAG}\nARG TAG\nARG B=b\nENV A=\"x $B\" C=${B}c D=${NOPE:-d} P=$PATH:/opt\n\
                WORKDIR /w/$B\nUSER ${U:-app}\nENV OLD form with spaces";
    let d = df(text);
    let s = &d.stages[0];
    assert_eq!(s.from, From::Image("img:1".into()));
    let got: Vec<Instr> = s.steps.iter().map(|(_, i)| i.clone()).collect();
    assert_eq!(
        got,
        [
            Instr::Arg(vec![("TAG".into(), "1".into())]),
            Instr::Arg(vec![("B".into(), "b".into())]),
            env(&[
                ("A", "x b"),
                ("C", "bc"),
                ("D", "${NOPE:-d}"),
                ("P", "$PATH:/opt")
            ]),
            Instr::Workdir("/w/b".into()),
            Instr::User("app".into()),
            env(&[("OLD", "form with spaces")]),
        ]
    );
    // Overrides win over defaults, globally and in a stage.
    let args = HashMap::from([
        ("TAG".to_string(), "2".to_string()),
        ("B".into(), "o".into()),
    ]);
    let d = parse(text, &args).unwrap();
    assert_eq!(d.stages[0].from, From::Image("img:2".into()));
    assert_eq!(
        d.stages[0].steps[1].1,
        Instr::Arg(vec![("B".into(), "o".into())])
    );
    // Global ARGs are not in a stage's scope unless declared there.
    let d = df("ARG G=g\nFROM a\nWORKDIR /$G/x");
    assert_eq!(d.stages[0].steps[0].1, Instr::Workdir("//x".into()));
    // Quotes: single quotes are literal, escapes escape.
    assert_eq!(
        instrs("FROM a\nWORKDIR '/a b'")[0],
        Instr::Workdir("/a b".into())
    );
    assert_eq!(
        instrs("FROM a\nARG X=1\nWORKDIR \"/$X\"/\\$X")[1],
        Instr::Workdir("/1/$X".into())
    );
    assert_eq!(
        instrs("FROM a\nARG X\nWORKDIR /${X:+set}${X-unset}${Y-unset}")[1],
        // X is declared (empty): `:+` gives nothing, `-` its empty value; Y is not.
        Instr::Workdir("/unset".into())
    );
}

#[test]
fn copy_sources_flags_and_stages() {
    let text = "FROM e2bdev/base AS build\nRUN make\nFROM e2bdev/base\n\
                COPY --chown=app:app --chmod=644 a.txt /src/ ./ /dest/\nCOPY --from=build /out/bin /usr/local/bin/\n\
                COPY --from=0 [\"/x y\", \"/z\"]\nADD b /b";
    let d = df(text);
    assert_eq!(d.stages[0].name.as_deref(), Some("build"));
    let got: Vec<Instr> = d.stages[1].steps.iter().map(|(_, i)| i.clone()).collect();
    assert_eq!(
        got[0],
        Instr::Copy {
            srcs: vec!["a.txt".into(), "src".into(), ".".into()],
            dest: "/dest/".into(),
            owner: Some("app:app".into()),
            mode: Some(0o644),
            from: None
        }
    );
    assert!(matches!(&got[1], Instr::Copy { from: Some(0), srcs, .. } if srcs == &["out/bin"]));
    assert!(matches!(&got[2], Instr::Copy { from: Some(0), dest, .. } if dest == "/z"));
    let spec = d.to_build_spec(Some(HASH), false).unwrap();
    assert_eq!(spec.stages.len(), 1);
    assert_eq!(spec.stages[0].name, "build");
    let from_steps: Vec<_> = spec
        .steps
        .iter()
        .filter(|s| matches!(s.kind, StepKind::CopyFrom { .. }))
        .collect();
    assert_eq!(from_steps.len(), 2);
    assert!(matches!(
        &from_steps[0].kind,
        StepKind::CopyFrom {
            from: CopyOrigin::Stage(0),
            ..
        }
    ));
    assert_eq!(from_steps[0].line, Some(5));
    // Three context copies from line 4 (one per source), each from the context tar.
    let copies: Vec<_> = spec
        .steps
        .iter()
        .filter(|s| matches!(&s.kind, StepKind::Copy { files_hash, .. } if files_hash == HASH))
        .collect();
    assert_eq!(copies.len(), 4);
}

#[test]
fn unused_stages_are_not_built_and_from_a_stage_starts_with_its_steps() {
    let d = df(
        "FROM e2bdev/base AS a\nRUN a\nFROM e2bdev/base AS unused\nRUN u\nFROM a\nENV X=1\nRUN b",
    );
    let spec = d.to_build_spec(None, false).unwrap();
    assert!(spec.stages.is_empty());
    let runs: Vec<_> = spec
        .steps
        .iter()
        .filter_map(|s| match &s.kind {
            StepKind::Run { command, .. } => Some(command.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(runs, ["a", "b"]);
    // ENV carries into a stage built FROM another one.
    let d = df("FROM e2bdev/base AS a\nENV X=1\nFROM a\nWORKDIR /$X");
    assert_eq!(d.stages[1].steps[0].1, Instr::Workdir("/1".into()));
}

#[test]
fn the_sdks_defaults_come_first_and_last() {
    let k = kinds("FROM e2bdev/base\nRUN x");
    assert_eq!(k[0], StepKind::User("root".into()));
    assert_eq!(k[1], StepKind::Workdir("/".into()));
    assert_eq!(k[3], StepKind::User("user".into()));
    assert_eq!(k[4], StepKind::Workdir("/home/user".into()));
    let k = kinds("FROM e2bdev/base\nUSER node\nWORKDIR /app");
    assert_eq!(k.len(), 4, "{k:?}");
    let spec = df("FROM e2bdev/base").to_build_spec(None, true).unwrap();
    assert!(spec.force);
    assert_eq!(
        spec.source,
        BuildSource::Image {
            reference: "e2bdev/base".into(),
            registry: None
        }
    );
}

#[test]
fn entrypoint_and_cmd_combine_as_docker_does() {
    let start = |t: &str| df(&format!("FROM a\n{t}")).stages[0].start_cmd();
    assert_eq!(
        start("CMD [\"node\", \"x.js\"]").as_deref(),
        Some("node x.js")
    );
    assert_eq!(
        start("CMD python3 -m http.server").as_deref(),
        Some("python3 -m http.server")
    );
    assert_eq!(
        start("ENTRYPOINT [\"/e\", \"a b\"]\nCMD [\"--x\"]").as_deref(),
        Some("/e 'a b' --x")
    );
    assert_eq!(
        start("ENTRYPOINT [\"/e\"]\nCMD run it").as_deref(),
        Some("/e /bin/sh -c 'run it'")
    );
    assert_eq!(
        start("ENTRYPOINT /e shell\nCMD [\"ignored\"]").as_deref(),
        Some("/e shell")
    );
    assert_eq!(start("CMD a\nCMD b").as_deref(), Some("b"));
    assert_eq!(start("RUN x"), None);
    assert_eq!(start("CMD []"), None);
    // An ENTRYPOINT clears a CMD inherited from the stage it starts from.
    let d = df("FROM a AS p\nCMD [\"old\"]\nFROM p\nENTRYPOINT [\"new\"]");
    assert_eq!(d.stages[1].start_cmd().as_deref(), Some("new"));
    let d = df("FROM a AS p\nCMD [\"old\"]\nFROM p");
    assert_eq!(d.stages[1].start_cmd().as_deref(), Some("old"));
    let spec = df("FROM a\nCMD [\"srv\"]\nHEALTHCHECK --interval=5s CMD curl -f localhost")
        .to_build_spec(None, false)
        .unwrap();
    assert_eq!(spec.start_cmd.as_deref(), Some("srv"));
    assert_eq!(spec.ready_cmd.as_deref(), Some("curl -f localhost"));
    assert_eq!(
        df("FROM a\nHEALTHCHECK CMD x\nHEALTHCHECK NONE").stages[0].healthcheck,
        None
    );
}

#[test]
fn harmless_instructions_are_noted_and_ignored() {
    let d = df(
        "FROM a\nLABEL a=b\nMAINTAINER me\nVOLUME /data\nSTOPSIGNAL SIGTERM\nEXPOSE 8080 53/udp\n\
                RUN --mount=type=cache,target=/root/.cache pip install x",
    );
    assert_eq!(d.stages[0].exposed, ["8080", "53/udp"]);
    assert_eq!(d.stages[0].steps.len(), 1);
    let lines: Vec<usize> = d.notes.iter().map(|n| n.0).collect();
    assert_eq!(lines, [2, 3, 4, 5, 6, 7]);
    let spec = d.to_build_spec(None, false).unwrap();
    assert!(
        spec.notes[0].starts_with("Dockerfile line 2: LABEL ignored"),
        "{:?}",
        spec.notes
    );
}

#[test]
fn refusals_name_their_line() {
    let cases: &[(&str, usize, &str)] = &[
        (
            "FROM a\nRUN x\nCOPY --link a /b",
            3,
            "COPY --link is not supported",
        ),
        ("FROM a\nSHELL [\"/bin/zsh\"]", 2, "SHELL is not supported"),
        ("FROM a\nONBUILD RUN x", 2, "ONBUILD is not supported"),
        (
            "FROM a\nFROBNICATE x",
            2,
            "the instruction FROBNICATE is not supported",
        ),
        ("FROM a\nRUN <<EOF\necho\nEOF", 2, "heredoc"),
        ("FROM a\n\nCOPY <<-EOT /x\nhi\nEOT", 3, "heredoc"),
        ("FROM a\nADD https://example.com/x /x", 2, "ADD of a URL"),
        ("FROM a\nADD app.tar.gz /x", 2, "ADD of an archive"),
        ("FROM a\nADD --checksum=sha256:00 a /x", 2, "ADD --checksum"),
        (
            "FROM a AS s\nFROM a\nCOPY --from=s /x/*.py /x/",
            3,
            "COPY --from with a wildcard",
        ),
        (
            "FROM a\nCOPY --from=alpine:3 /x /x",
            2,
            "an image, not an earlier stage",
        ),
        (
            "FROM a\nCOPY --from=later /x /x\nFROM b AS later",
            2,
            "an image, not an earlier stage",
        ),
        (
            "FROM a\nCOPY --from=5 /x /x",
            2,
            "no earlier stage named '5'",
        ),
        (
            "FROM a AS me\nCOPY --from=me /x /x",
            2,
            "no earlier stage named 'me'",
        ),
        (
            "FROM a\nCOPY --from=0 /x /x",
            2,
            "no earlier stage named '0'",
        ),
        (
            "FROM a\nCOPY a b c",
            2,
            "several sources needs a destination ending in /",
        ),
        ("FROM a\nCOPY a", 2, "at least one source"),
        ("FROM a\nCOPY ../x /x", 2, "leaves the build context"),
        (
            "FROM a\nCOPY --chmod=u+x a /a",
            2,
            "--chmod=u+x is not supported",
        ),
        ("FROM a\nCOPY --chown=a/b a /a", 2, "invalid --chown"),
        (
            "FROM a\nRUN --network=none x",
            2,
            "RUN --network is not supported",
        ),
        (
            "FROM a\nRUN --mount=type=secret,id=x x",
            2,
            "RUN --mount is not supported",
        ),
        ("FROM scratch", 1, "FROM scratch"),
        ("FROM a AS x\nFROM b AS X", 2, "duplicate stage name"),
        ("FROM a AS 1x", 1, "invalid stage name"),
        ("FROM", 1, "FROM expects an image"),
        ("RUN x", 1, "expected FROM"),
        ("# only a comment\n", 1, "expected FROM"),
        ("\n\nARG A\nENV B=1", 4, "expected FROM"),
        ("FROM a\nENV", 2, "ENV expects name=value"),
        ("FROM a\nENV 1A=b", 2, "invalid ENV name"),
        ("FROM a\nENV A='$x'", 2, "literal '$'"),
        ("FROM a\nENV A=\\$x", 2, "literal '$'"),
        ("FROM a\nWORKDIR /${X#y}", 2, "unsupported substitution"),
        ("FROM a\nWORKDIR ${X:?needs X}", 2, "X: needs X"),
        ("FROM a\nWORKDIR \"/x", 2, "unterminated"),
        ("FROM a\nUSER a b", 2, "invalid user name"),
        ("FROM a\nUSER app:grp", 2, "USER with a group"),
        ("FROM a\nUSER $NOPE", 2, "empty after substitution"),
        ("FROM a\nEXPOSE 99999", 2, "invalid port"),
        ("FROM a\nHEALTHCHECK x", 2, "HEALTHCHECK expects CMD"),
        ("FROM a\nRUN", 2, "RUN expects a command"),
        ("# escape=x\nFROM a", 1, "invalid escape directive"),
        (
            "FROM a\nRUN ok \\\n  more\nVOLUME\nMAINTAINER\nFOO",
            6,
            "FOO",
        ),
    ];
    for (text, line, want) in cases {
        let e = err(text);
        assert_eq!(e.line(), *line, "{text:?}: {e}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("Dockerfile line {line}: ")),
            "{msg}"
        );
        assert!(msg.contains(want), "{text:?}: {msg} lacks {want}");
    }
}

#[test]
fn copy_without_a_context_names_its_line() {
    let d = df("FROM a\nRUN x\nCOPY a /a");
    let e = d.to_build_spec(None, false).unwrap_err();
    assert_eq!(e.line(), 3);
    assert!(e.to_string().contains("contextFilesHash"), "{e}");
    let e = d.to_build_spec(Some("nothex"), false).unwrap_err();
    assert!(e.to_string().contains("64 lowercase hex"), "{e}");
}

#[test]
fn the_sdk_example_gives_the_sdks_steps() {
    // e2b-compat-wave2.md §1.6's verified example (with a stage named for the base).
    let text = "FROM node:20\nARG V=1\nENV A=b C=$A\nWORKDIR app\nCOPY --chown=app:app --chmod=644 a.txt b/\n\
                RUN [\"echo\",\"x y\"]\nUSER node\nCMD [\"node\",\"x.js\"]";
    let spec = df(text).to_build_spec(Some(HASH), false).unwrap();
    let k: Vec<StepKind> = spec.steps.iter().map(|s| s.kind.clone()).collect();
    assert_eq!(
        k,
        [
            StepKind::User("root".into()),
            StepKind::Workdir("/".into()),
            StepKind::Env(vec![("V".into(), "1".into())]),
            // The SDK sends `C=$A` for the builder to expand; known variables are substituted
            // here, to the same value.
            StepKind::Env(vec![("A".into(), "b".into()), ("C".into(), "b".into())]),
            StepKind::Workdir("app".into()),
            StepKind::Copy {
                src: "a.txt".into(),
                dest: "b/".into(),
                owner: Some("app:app".into()),
                mode: Some(0o644),
                files_hash: HASH.into()
            },
            StepKind::Run {
                command: "echo 'x y'".into(),
                user: None
            },
            StepKind::User("node".into()),
        ]
    );
    assert_eq!(spec.start_cmd.as_deref(), Some("node x.js"));
    assert_eq!(
        spec.source,
        BuildSource::Image {
            reference: "node:20".into(),
            registry: None
        }
    );
}

#[test]
fn wildcard_sources_copy_what_they_match() {
    let k = kinds("FROM a\nCOPY *.py src/[ab]?.txt /app/");
    assert_eq!(
        k[2],
        StepKind::CopyGlob {
            pattern: "*.py".into(),
            dest: "/app/".into(),
            owner: None,
            mode: None,
            files_hash: HASH.into()
        }
    );
    assert!(matches!(&k[3], StepKind::CopyGlob { pattern, .. } if pattern == "src/[ab]?.txt"));
}

#[test]
fn shell_quoting_matches_pythons_shlex() {
    assert_eq!(shell_quote("abc-1.2/x=y"), "abc-1.2/x=y");
    assert_eq!(shell_quote(""), "''");
    assert_eq!(shell_quote("a b"), "'a b'");
    assert_eq!(shell_quote("it's"), "'it'\"'\"'s'");
}

//! The build API's Dockerfile extension through the real server and store: what a
//! `dockerfile` body becomes for the builder (stages, their parents, `COPY --from`, the start
//! command, notes in the log), and the 400s for conflicts and refused lines. The builder here
//! records the job it is given and finishes it: what it would run is `warren-build`'s, tested
//! end to end in `tests/e2e/test_dockerfile.py`.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{TestServer, API_KEY};
use serde_json::{json, Value};
use warren_control::{
    BuildFailure, BuildJob, BuildLog, BuilderError, BuiltImage, CopyOrigin, DiskUse, StepKind,
    TemplateBuilder,
};

#[derive(Default)]
struct Recording {
    files: Mutex<HashSet<String>>,
    jobs: Mutex<Vec<BuildJob>>,
}

#[async_trait]
impl TemplateBuilder for Recording {
    async fn has_files(&self, _team: &str, hash: &str) -> Result<bool, BuilderError> {
        Ok(self.files.lock().unwrap().contains(hash))
    }

    async fn put_files(
        &self,
        _team: &str,
        hash: &str,
        mut body: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    ) -> Result<(), BuilderError> {
        let mut sink = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut body, &mut sink)
            .await
            .map_err(|e| BuilderError::Invalid(e.to_string()))?;
        self.files.lock().unwrap().insert(hash.to_string());
        Ok(())
    }

    async fn build(&self, job: BuildJob, _log: BuildLog) -> Result<BuiltImage, BuildFailure> {
        self.jobs.lock().unwrap().push(job);
        Err(BuildFailure {
            step: Some("base".into()),
            message: "recorded, not built".into(),
        })
    }

    async fn remove_image(&self, _key: &str) -> Result<(), BuilderError> {
        Ok(())
    }

    async fn disk_use(&self, _keep: &[String]) -> Result<DiskUse, BuilderError> {
        Ok(DiskUse::default())
    }

    async fn prune(&self, _keep: &[String]) -> Result<DiskUse, BuilderError> {
        Ok(DiskUse::default())
    }
}

async fn call(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    s.call_as(API_KEY, method, path, body).await
}

async fn register(s: &TestServer, name: &str) -> (String, String) {
    let (status, body) = call(
        s,
        reqwest::Method::POST,
        "/v3/templates",
        Some(json!({"name": name})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    (
        body["templateID"].as_str().unwrap().to_string(),
        body["buildID"].as_str().unwrap().to_string(),
    )
}

const HASH: &str = "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef";

#[tokio::test]
async fn a_dockerfile_becomes_stages_steps_and_a_start_command() {
    let rec = Arc::new(Recording::default());
    let s = TestServer::start_building(rec.clone()).await;
    let (tid, bid) = register(&s, "df-job").await;
    // The context upload, through the signed link, as the CLI does it.
    let (status, link) = call(
        &s,
        reqwest::Method::GET,
        &format!("/templates/{tid}/files/{HASH}"),
        None,
    )
    .await;
    assert_eq!(status, 201, "{link}");
    let put = s
        .client()
        .put(link["url"].as_str().unwrap())
        .body(vec![0u8; 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let text = "ARG B=e2bdev/base\nFROM $B AS maker\nRUN make\nFROM $B AS unused\nRUN x\nFROM ${B}\n\
                LABEL a=b\nCOPY --from=maker /out /opt/out\nCOPY app /app\nCMD [\"/app/run\", \"a b\"]\n";
    let (status, body) = call(
        &s,
        reqwest::Method::POST,
        &format!("/v2/templates/{tid}/builds/{bid}"),
        Some(json!({"dockerfile": text, "contextFilesHash": HASH, "buildArgs": {"UNUSED": "1"}})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let job = loop {
        if let Some(j) = rec.jobs.lock().unwrap().first().cloned() {
            break j;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Only the stage that is copied from is built, from the base template, as the last one.
    assert_eq!(job.spec.stages.len(), 1);
    assert_eq!(job.spec.stages[0].name, "maker");
    assert_eq!(job.stage_parents, [Some("base".to_string())]);
    assert_eq!(job.parent.as_deref(), Some("base"));
    assert!(job.spec.steps.iter().any(|st| matches!(
        &st.kind,
        StepKind::CopyFrom { from: CopyOrigin::Stage(0), srcs, dest, .. } if srcs == &["out"] && dest == "/opt/out"
    )));
    let copy = job
        .spec
        .steps
        .iter()
        .find(|st| matches!(st.kind, StepKind::Copy { .. }))
        .unwrap();
    assert_eq!(copy.line, Some(9));
    assert_eq!(job.spec.start_cmd.as_deref(), Some("/app/run 'a b'"));
    // The ignored LABEL is in the build's log, with its line.
    let (_, page) = call(
        &s,
        reqwest::Method::GET,
        &format!("/templates/{tid}/builds/{bid}/status"),
        None,
    )
    .await;
    let logs: Vec<&str> = page["logEntries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(
        logs.iter()
            .any(|l| l.starts_with("Dockerfile line 7: LABEL ignored")),
        "{logs:?}"
    );
    s.stop().await;
}

#[tokio::test]
async fn conflicts_and_refused_lines_are_400s_and_start_nothing() {
    let rec = Arc::new(Recording::default());
    let s = TestServer::start_building(rec.clone()).await;
    let (tid, bid) = register(&s, "df-bad").await;
    let path = format!("/v2/templates/{tid}/builds/{bid}");
    let cases = [
        (
            json!({"dockerfile": "FROM a\n", "fromImage": "x"}),
            "dockerfile conflicts with fromImage",
        ),
        (
            json!({"dockerfile": "FROM a\n", "steps": [], "fromTemplate": "base"}),
            "conflicts with steps, fromTemplate",
        ),
        (
            json!({"dockerfile": "FROM a\nRUN x\nVOLUME /v\nFOO bar\n"}),
            "Dockerfile line 4: the instruction FOO is not supported",
        ),
        (
            json!({"dockerfile": "FROM a\nCOPY x /x\n"}),
            "Dockerfile line 2: COPY needs the build context",
        ),
        (
            json!({"fromTemplate": "base", "contextFilesHash": HASH}),
            "go with dockerfile",
        ),
        (
            json!({"dockerfile": "FROM a\nCOPY x /x\n", "contextFilesHash": HASH}),
            "never uploaded",
        ),
    ];
    for (body, want) in cases {
        let (status, answer) = call(&s, reqwest::Method::POST, &path, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let msg = answer["message"].as_str().unwrap_or_default();
        assert!(msg.contains(want), "{body}: {msg} lacks {want}");
    }
    assert!(rec.jobs.lock().unwrap().is_empty());
    let (_, page) = call(
        &s,
        reqwest::Method::GET,
        &format!("/templates/{tid}/builds/{bid}/status"),
        None,
    )
    .await;
    assert_eq!(page["status"], "waiting", "{page}");
    s.stop().await;
}

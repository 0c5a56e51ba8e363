//! The proto3-JSON mapping must match what E2B's SDKs send and parse.

use serde_json::json;
use warren_proto::filesystem::{EntryInfo, FileType};
use warren_proto::process::process_event::{data_event, DataEvent, EndEvent, Event};
use warren_proto::process::{ProcessEvent, SendSignalRequest, Signal, StartRequest, StartResponse};

#[test]
fn start_request_as_the_python_sdk_sends_it() {
    let req: StartRequest = serde_json::from_value(json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}, "cwd": "/tmp"},
        "stdin": false,
        "somethingNew": 1
    }))
    .unwrap();
    let p = req.process.as_ref().unwrap();
    assert_eq!(p.cmd, "/bin/bash");
    assert_eq!(p.envs["A"], "1");
    assert_eq!(p.cwd.as_deref(), Some("/tmp"));
    assert_eq!(
        req.stdin,
        Some(false),
        "optional false is kept, not defaulted away"
    );
    // Re-encoding keeps the explicitly set optional.
    assert_eq!(serde_json::to_value(&req).unwrap()["stdin"], json!(false));
}

#[test]
fn events_use_camel_case_base64_and_omit_defaults() {
    let data = StartResponse {
        event: Some(ProcessEvent {
            event: Some(Event::Data(DataEvent {
                output: Some(data_event::Output::Stdout(b"hi\n".to_vec())),
            })),
        }),
    };
    assert_eq!(
        serde_json::to_value(&data).unwrap(),
        json!({"event": {"data": {"stdout": "aGkK"}}})
    );

    let end = StartResponse {
        event: Some(ProcessEvent {
            event: Some(Event::End(EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            })),
        }),
    };
    assert_eq!(
        serde_json::to_value(&end).unwrap(),
        json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
    );
}

#[test]
fn enums_are_names_and_int64_is_a_string() {
    let sig: SendSignalRequest =
        serde_json::from_value(json!({"process": {"pid": 7}, "signal": "SIGNAL_SIGKILL"})).unwrap();
    assert_eq!(sig.signal, Signal::Sigkill as i32);

    let entry = EntryInfo {
        name: "a.txt".into(),
        r#type: FileType::File as i32,
        path: "/home/user/a.txt".into(),
        size: 5,
        mode: 0o644,
        permissions: "-rw-r--r--".into(),
        owner: "user".into(),
        group: "user".into(),
        modified_time: Some(warren_proto::Timestamp {
            seconds: 1_735_732_800,
            nanos: 1,
        }),
        symlink_target: None,
        metadata: Default::default(),
        is_symlink: false,
    };
    let v = serde_json::to_value(&entry).unwrap();
    assert_eq!(v["type"], "FILE_TYPE_FILE");
    assert_eq!(v["size"], "5");
    assert_eq!(v["mode"], 420);
    assert_eq!(v["modifiedTime"], "2025-01-01T12:00:00.000000001Z");
    assert!(v.get("isSymlink").is_none());
    assert!(v.get("symlinkTarget").is_none());
    // Numbers are accepted for int64 on input, and snake_case names too.
    let back: EntryInfo =
        serde_json::from_value(json!({"size": 5, "modified_time": "2025-01-01T12:00:00Z"}))
            .unwrap();
    assert_eq!(back.size, 5);
}

#[test]
fn bytes_accept_url_safe_base64() {
    let d: DataEvent = serde_json::from_value(json!({"stdout": "-_8"})).unwrap();
    assert_eq!(d.output, Some(data_event::Output::Stdout(vec![0xfb, 0xff])));
}

//! Helpers shared by the host manager's integration tests.

use std::net::SocketAddr;

use base64::Engine;

/// Runs `cmd` through the sandbox's agent (as the host reaches it) and returns its output.
pub async fn run(agent: SocketAddr, cmd: &str) -> (i64, String) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let msg = serde_json::json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": false});
    let payload = serde_json::to_vec(&msg).unwrap();
    let mut body = vec![0u8];
    body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    body.extend_from_slice(&payload);
    let resp = reqwest::Client::new()
        .post(format!("http://{agent}/process.Process/Start"))
        .header("content-type", "application/connect+json")
        .header("x-access-token", "tok")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let raw = resp.bytes().await.unwrap();
    let (mut out, mut code, mut rest) = (String::new(), i64::MIN, &raw[..]);
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let v: serde_json::Value = serde_json::from_slice(&rest[5..5 + len]).unwrap();
        if let Some(d) = v["event"].get("data") {
            for k in ["stdout", "stderr"] {
                if let Some(s) = d.get(k) {
                    out.push_str(&String::from_utf8_lossy(
                        &b64.decode(s.as_str().unwrap()).unwrap(),
                    ));
                }
            }
        } else if let Some(e) = v["event"].get("end") {
            code = e.get("exitCode").and_then(|c| c.as_i64()).unwrap_or(0);
        }
        rest = &rest[5 + len..];
    }
    assert_ne!(
        code,
        i64::MIN,
        "no end event: {}",
        String::from_utf8_lossy(&raw)
    );
    (code, out)
}

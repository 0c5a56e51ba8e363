//! The build sandbox: commands and file uploads through its agent, as the SDKs would do.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use warren_proto::client::{AgentClient, CallOptions};
use warren_proto::process::process_event::{data_event, Event};
use warren_proto::process::{ProcessConfig, StartRequest};

/// Longest a single RUN may take (upstream's limit).
pub(crate) const RUN_TIMEOUT: Duration = Duration::from_secs(3600);

/// Which stream a line of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// A command's outcome.
#[derive(Debug, Clone)]
pub(crate) struct Finished {
    pub exit_code: i32,
    /// The last few KiB of its output (for error messages).
    pub tail: String,
}

/// Splits a byte stream into lines for the log, keeping a partial last line until it ends.
#[derive(Default)]
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    fn feed(&mut self, bytes: &[u8], mut out: impl FnMut(&str)) {
        self.partial.extend_from_slice(bytes);
        while let Some(i) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            out(String::from_utf8_lossy(&line[..line.len() - 1]).trim_end_matches('\r'));
        }
        // A line that never ends must not grow without bound.
        if self.partial.len() > 64 * 1024 {
            let line = std::mem::take(&mut self.partial);
            out(&String::from_utf8_lossy(&line));
        }
    }

    fn flush(&mut self, mut out: impl FnMut(&str)) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            out(&String::from_utf8_lossy(&line));
        }
    }
}

/// A running build sandbox's agent.
pub(crate) struct BuildBox {
    pub id: String,
    addr: SocketAddr,
    token: String,
    http: reqwest::Client,
}

impl BuildBox {
    pub(crate) fn new(id: String, addr: SocketAddr, token: String, http: reqwest::Client) -> Self {
        BuildBox {
            id,
            addr,
            token,
            http,
        }
    }

    fn agent(&self) -> Result<AgentClient, String> {
        AgentClient::at(self.http.clone(), self.addr)
            .with_access_token(&self.token)
            .map_err(|e| e.to_string())
    }

    /// Runs `argv` as `user` in `cwd` with exactly `env`, sending every output line to
    /// `on_line`; `Err` when the agent would not run it (an unknown user, say).
    pub(crate) async fn run(
        &self,
        argv: &[String],
        user: &str,
        cwd: Option<&str>,
        env: &BTreeMap<String, String>,
        mut on_line: impl FnMut(Stream, &str),
    ) -> Result<Finished, String> {
        let (mut out, mut err) = (Lines::default(), Lines::default());
        let mut tail = String::new();
        let mut keep = |s: Stream, line: &str, tail: &mut String| {
            on_line(s, line);
            tail.push_str(line);
            tail.push('\n');
            if tail.len() > 4096 {
                let cut = tail.len() - 4096;
                let cut = (cut..tail.len())
                    .find(|i| tail.is_char_boundary(*i))
                    .unwrap_or(0);
                tail.drain(..cut);
            }
        };
        let exit_code = self
            .run_raw(argv, user, cwd, env, |s, bytes| match s {
                Stream::Stdout => out.feed(bytes, |l| keep(Stream::Stdout, l, &mut tail)),
                Stream::Stderr => err.feed(bytes, |l| keep(Stream::Stderr, l, &mut tail)),
            })
            .await?;
        out.flush(|l| keep(Stream::Stdout, l, &mut tail));
        err.flush(|l| keep(Stream::Stderr, l, &mut tail));
        Ok(Finished { exit_code, tail })
    }

    /// [`Self::run`] with the output as it comes, in chunks; returns the exit code.
    pub(crate) async fn run_raw(
        &self,
        argv: &[String],
        user: &str,
        cwd: Option<&str>,
        env: &BTreeMap<String, String>,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<i32, String> {
        let (program, args) = argv.split_first().ok_or("empty command")?;
        let request = StartRequest {
            process: Some(ProcessConfig {
                cmd: program.clone(),
                args: args.to_vec(),
                envs: env.clone().into_iter().collect(),
                cwd: cwd.map(str::to_string),
            }),
            stdin: Some(false),
            ..Default::default()
        };
        let opts = CallOptions::new()
            .user(user)
            .timeout(RUN_TIMEOUT)
            .keepalive_ping_interval(Duration::from_secs(30))
            .max_message(4 << 20);
        let agent = self.agent()?;
        let mut stream = agent
            .process()
            .start(&request, &opts)
            .await
            .map_err(|e| error_text(&e))?;
        loop {
            let msg = stream.next().await.map_err(|e| error_text(&e))?;
            let Some(msg) = msg else {
                return Err("the agent ended the command's stream before its end".into());
            };
            match msg.event.and_then(|e| e.event) {
                Some(Event::Data(d)) => match d.output {
                    Some(data_event::Output::Stdout(b)) => on_output(Stream::Stdout, &b),
                    Some(data_event::Output::Stderr(b)) => on_output(Stream::Stderr, &b),
                    _ => {}
                },
                Some(Event::End(end)) => return Ok(end.exit_code),
                _ => {}
            }
        }
    }

    /// Runs a shell script as root and returns its output; a non-zero exit is `Err` with it.
    pub(crate) async fn root_script(&self, script: &str) -> Result<String, String> {
        let argv = ["/bin/sh".to_string(), "-c".to_string(), script.to_string()];
        let mut output = String::new();
        let done = self
            .run(&argv, "root", Some("/"), &BTreeMap::new(), |_, l| {
                output.push_str(l);
                output.push('\n');
            })
            .await?;
        if done.exit_code != 0 {
            return Err(format!(
                "exit status {}: {}",
                done.exit_code,
                done.tail.trim_end()
            ));
        }
        Ok(output)
    }

    /// Uploads the host file `src` to `dest` in the sandbox, as root.
    pub(crate) async fn upload(&self, src: &Path, dest: &str) -> Result<(), String> {
        let file = tokio::fs::File::open(src)
            .await
            .map_err(|e| format!("open {}: {e}", src.display()))?;
        let len = file
            .metadata()
            .await
            .map_err(|e| format!("stat {}: {e}", src.display()))?
            .len();
        let body = reqwest::Body::wrap_stream(tokio_util_stream(file));
        let resp = self
            .http
            .post(format!("http://{}/files", self.addr))
            .query(&[("path", dest), ("username", "root")])
            .header("x-access-token", &self.token)
            .header("content-type", "application/octet-stream")
            .header("content-length", len)
            .body(body)
            .timeout(RUN_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("upload to {dest}: {e}"))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(format!("upload to {dest}: HTTP {status}: {text}"));
        }
        Ok(())
    }
}

/// A file as a stream of chunks for a request body.
fn tokio_util_stream(
    file: tokio::fs::File,
) -> impl futures::stream::Stream<Item = std::io::Result<Vec<u8>>> {
    futures::stream::unfold(file, |mut f| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 256 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    })
}

/// The agent's own words for why a call failed (`invalid username: 'x'`), else the error.
fn error_text(e: &warren_proto::client::Error) -> String {
    match e.rpc() {
        Some(rpc) => format!("{}: {}", rpc.code.as_str(), rpc.message),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_cut_into_lines_across_chunks() {
        let mut lines = Lines::default();
        let mut got = Vec::new();
        lines.feed(b"a\nb", |l| got.push(l.to_string()));
        lines.feed(b"c\r\nd", |l| got.push(l.to_string()));
        lines.flush(|l| got.push(l.to_string()));
        assert_eq!(got, ["a", "bc", "d"]);
    }
}

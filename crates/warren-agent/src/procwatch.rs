//! Every program executed in the sandbox, for the journal (`process.exec`, `process.exit`),
//! whoever started it: a command through the API, a shell in a terminal, a script's children.
//!
//! The kernel's process events connector reports them (`warren-procwatch`); it serves only
//! root of the kernel's initial namespaces. That is the agent in a microVM (`vm` runtime),
//! where it is the guest kernel's root. In the `ns` runtime the agent runs in a user
//! namespace, the kernel would not answer, and the host watches for it instead
//! (`warren-runtime-ns`, `SandboxRuntime::journal`).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use warren_procwatch::{procfs, Event, ExitStatus, ProcInfo, Tracker, Watcher};
use warren_proto::journal::{Level, AGENT, PROCESS_EXEC, PROCESS_EXIT};

use crate::journal::Journal;
use crate::state::AppState;
use crate::users::UserDb;

/// Processes followed from exec to exit at most (exits lost to an overrun would otherwise
/// pile up).
const TRACKED: usize = 65_536;
/// The argv field's bound: the journal's own on a field value (`journal::MAX_TEXT`).
const ARGV_JSON: usize = crate::journal::MAX_TEXT;

/// Starts watching in a thread of its own, when this agent is a microVM's agent.
///
/// The condition is `--sync-clock`: only `warren-vminit` passes it, when it hands PID 1 of a
/// microVM to the agent, so the agent is then root of the guest kernel and everything the
/// kernel reports happens in the sandbox. The `ns` runtime does not pass it (the kernel would
/// refuse anyway), and an agent run on a development host or by the agent's own tests does not
/// either, so it never records the whole host.
pub fn start(state: &AppState) {
    if !state.sync_clock || !state.journal.enabled() {
        return;
    }
    let journal = state.journal.clone();
    let spawned = std::thread::Builder::new()
        .name("procwatch".into())
        .spawn(move || run(&journal));
    if let Err(e) = spawned {
        tracing::debug!(error = %e, "process events: no thread");
    }
}

fn run(journal: &Arc<Journal>) {
    let mut watcher = match Watcher::subscribe() {
        Ok(w) => w,
        Err(e) => {
            tracing::debug!(error = %e, "process events unavailable; programs run inside are not recorded");
            return;
        }
    };
    let mut sink = Sink::new(journal.clone());
    loop {
        match watcher.next_events(Duration::from_secs(60)) {
            Ok(events) => events.into_iter().for_each(|e| sink.event(e)),
            Err(e) => {
                tracing::warn!(error = %e, "reading process events");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// What one followed process was started as.
#[derive(Clone)]
struct Tag {
    pid: u32,
    program: String,
}

struct Sink {
    journal: Arc<Journal>,
    tracker: Tracker<Tag>,
    /// This agent and its reaper (PID 1): their own doings are not the sandbox's.
    own: [u32; 2],
    users: Users,
}

impl Sink {
    fn new(journal: Arc<Journal>) -> Self {
        Self {
            journal,
            tracker: Tracker::new(TRACKED),
            own: [std::process::id(), 1],
            users: Users::default(),
        }
    }

    fn event(&mut self, event: Event) {
        match event {
            Event::Exec { pid, at_ns } if !self.own.contains(&pid) => {
                let info = ProcInfo::read(pid);
                let (message, fields) = exec_entry(&info, self.users.name(info.uid));
                let tag = Tag {
                    pid: info.nspid.last().copied().unwrap_or(pid),
                    program: info.argv.first().cloned().unwrap_or_default(),
                };
                self.tracker.exec(pid, at_ns, tag);
                self.journal
                    .record(PROCESS_EXEC, Level::Info, message, fields);
            }
            Event::Exit { pid, at_ns, status } => {
                if let Some(end) = self.tracker.exit(pid, at_ns) {
                    let (message, fields) = exit_entry(&end.tag, status, end.ran);
                    self.journal
                        .record(PROCESS_EXIT, Level::Info, message, fields);
                }
            }
            Event::Lost(n) => self.journal.record(
                AGENT,
                Level::Warn,
                format!("{n} process events lost (the kernel's buffer overflowed)"),
                BTreeMap::new(),
            ),
            _ => {}
        }
    }
}

/// The `process.exec` entry of a process.
fn exec_entry(info: &ProcInfo, user: Option<String>) -> (String, BTreeMap<String, String>) {
    let mut fields = BTreeMap::new();
    let pid = info.nspid.last().copied().unwrap_or(info.pid);
    fields.insert("pid".into(), pid.to_string());
    if let Some(ppid) = info.ppid {
        fields.insert("ppid".into(), ppid.to_string());
    }
    // Valid JSON within the journal's bound on a field (which would cut it anywhere).
    fields.insert("argv".into(), procfs::argv_json(&info.argv, ARGV_JSON));
    if !info.argv_complete {
        // The process ended before its command line was read: only its name is known.
        fields.insert("partial".into(), "true".into());
    }
    if let Some(cwd) = &info.cwd {
        fields.insert("cwd".into(), cwd.clone());
    }
    if let Some(uid) = info.uid {
        fields.insert("uid".into(), uid.to_string());
    }
    if let Some(user) = user {
        fields.insert("user".into(), user);
    }
    let message = if info.argv.is_empty() {
        format!("exec (pid {pid} ended before it was read)")
    } else {
        format!("exec {}", info.argv.join(" "))
    };
    (message, fields)
}

/// The `process.exit` entry of a followed process.
fn exit_entry(
    tag: &Tag,
    status: ExitStatus,
    ran: Option<Duration>,
) -> (String, BTreeMap<String, String>) {
    let mut fields = BTreeMap::new();
    fields.insert("pid".into(), tag.pid.to_string());
    let how = match status {
        ExitStatus::Exited(code) => {
            fields.insert("exit_code".into(), code.to_string());
            format!("code {code}")
        }
        ExitStatus::Signaled { signal, core } => {
            fields.insert("signal".into(), signal.to_string());
            if core {
                fields.insert("core_dumped".into(), "true".into());
            }
            format!("signal {signal}")
        }
    };
    if let Some(ran) = ran {
        fields.insert("duration_ms".into(), ran.as_millis().to_string());
    }
    let program = if tag.program.is_empty() {
        format!("pid {}", tag.pid)
    } else {
        tag.program.clone()
    };
    (format!("exit {program}: {how}"), fields)
}

/// Account names, read again when `/etc/passwd` changes (a build step may add users).
#[derive(Default)]
struct Users {
    db: Option<UserDb>,
    stamp: Option<(i64, i64, u64)>,
}

impl Users {
    fn name(&mut self, uid: Option<u32>) -> Option<String> {
        let uid = uid?;
        let stamp = std::fs::metadata("/etc/passwd")
            .ok()
            .map(|m| (m.mtime(), m.mtime_nsec(), m.ino()));
        if self.db.is_none() || stamp != self.stamp {
            self.db = Some(UserDb::load());
            self.stamp = stamp;
        }
        self.db.as_ref().map(|db| db.user_name(uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_entry_has_argv_as_json_and_the_owner() {
        let info = ProcInfo {
            pid: 40,
            comm: "ls".into(),
            argv: vec!["ls".into(), "-l".into(), "a b".into()],
            argv_complete: true,
            cwd: Some("/home/user".into()),
            uid: Some(1000),
            euid: Some(1000),
            ppid: Some(7),
            nspid: vec![40],
        };
        let (msg, f) = exec_entry(&info, Some("user".into()));
        assert_eq!(msg, "exec ls -l a b");
        assert_eq!(f["argv"], r#"["ls","-l","a b"]"#);
        assert_eq!(
            (
                f["pid"].as_str(),
                f["ppid"].as_str(),
                f["uid"].as_str(),
                f["user"].as_str()
            ),
            ("40", "7", "1000", "user")
        );
        assert_eq!(f["cwd"], "/home/user");
        assert!(!f.contains_key("partial"));
    }

    #[test]
    fn an_exec_entry_of_a_process_gone_too_soon_says_so() {
        let info = ProcInfo {
            pid: 41,
            ..ProcInfo::default()
        };
        let (msg, f) = exec_entry(&info, None);
        assert!(msg.contains("pid 41"), "{msg}");
        assert_eq!(f["partial"], "true");
        assert_eq!(f["argv"], "[]");
    }

    #[test]
    fn exit_entries_give_the_code_or_the_signal() {
        let tag = Tag {
            pid: 9,
            program: "/bin/false".into(),
        };
        let (msg, f) = exit_entry(&tag, ExitStatus::Exited(1), Some(Duration::from_millis(12)));
        assert_eq!(msg, "exit /bin/false: code 1");
        assert_eq!(
            (f["exit_code"].as_str(), f["duration_ms"].as_str()),
            ("1", "12")
        );
        let (msg, f) = exit_entry(
            &tag,
            ExitStatus::Signaled {
                signal: 9,
                core: false,
            },
            None,
        );
        assert_eq!(msg, "exit /bin/false: signal 9");
        assert_eq!(f["signal"], "9");
        assert!(!f.contains_key("exit_code") && !f.contains_key("duration_ms"));
    }
}

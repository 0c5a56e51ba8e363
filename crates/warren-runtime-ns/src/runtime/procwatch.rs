//! Every program executed inside this runtime's sandboxes, watched from the host: the
//! runtime's side of [`SandboxRuntime::journal`](warren_runtime::SandboxRuntime::journal).
//!
//! A sandbox's agent runs in a user namespace, where the kernel's process events connector
//! does not serve it; the server runs as root of the host, where it does. So one thread
//! subscribes for the whole host (`warren-procwatch`) and attributes each exec to a sandbox by
//! the process's cgroup (`/<cgroup_parent>/<id>[/...]`, the cgroup every sandbox process is
//! in), or, for a process gone before its cgroup could be read, by the sandbox of the parent
//! it was forked from. Pids and uids are written as the sandbox sees them: the pid from the
//! sandbox's pid namespace (`NSpid:`), the uid less the sandbox's host id range.
//!
//! The thread runs only while some sandbox is watched: it starts with the first and ends,
//! unsubscribing, with the last, so a host without sandboxes pays nothing (the kernel builds
//! process events only while someone listens). Creating a sandbox only adds it to a map.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use warren_procwatch::{procfs, Event, ExitStatus, ProcInfo, Tracker, Watcher};
use warren_proto::journal::{JournalEntry, JournalPage, Level, AGENT, PROCESS_EXEC, PROCESS_EXIT};

use crate::config::ID_COUNT;

/// Entries kept per sandbox; older ones are counted in a page's `dropped`.
pub const MAX_ENTRIES: usize = 4096;
/// Most entries one read returns.
const MAX_PAGE: usize = 1000;
/// Longest argv (as JSON) or message kept.
const MAX_TEXT: usize = 2048;
/// Processes followed at most (exits lost to an overrun would otherwise pile up).
const TRACKED: usize = 65_536;
/// The argv field's bound (the ring's on any field).
const ARGV_JSON: usize = MAX_TEXT;

/// The journals of this runtime's sandboxes, and the thread that writes them.
pub struct HostWatch {
    shared: Arc<Shared>,
}

struct Shared {
    /// Names this run of the runtime (a reader's cursor is void across runs).
    boot: String,
    /// `/<cgroup_parent>/`: a sandbox's processes are in `<prefix><id>` or below.
    prefix: String,
    /// Index in `NSpid:` of a sandbox's pid namespace (one below ours).
    depth: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<String, Ring>,
    /// Processes of newly watched sandboxes, for the thread to follow (their children are
    /// attributed even when gone before their cgroup is read).
    adopt: Vec<(u32, Arc<str>)>,
    running: bool,
    /// Why this host cannot watch (set once, when subscribing failed).
    unavailable: Option<String>,
}

struct Ring {
    id_base: u32,
    entries: VecDeque<JournalEntry>,
    /// The last `seq` handed out.
    seq: u64,
}

/// What the thread remembers of a followed process.
#[derive(Clone)]
struct Tag {
    sandbox: Arc<str>,
    /// As the sandbox sees it.
    pid: Option<u32>,
    program: String,
}

impl HostWatch {
    /// Journals for the sandboxes in cgroups under `cgroup_parent`; nothing runs yet.
    pub fn new(cgroup_parent: &str) -> Self {
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let own_depth = procfs::nspid(std::process::id()).len().max(1);
        Self {
            shared: Arc::new(Shared {
                boot: format!("host-{:016x}", h.finish()),
                prefix: format!("/{}/", cgroup_parent.trim_matches('/')),
                depth: own_depth,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Watches sandbox `id` (whose ids start at `id_base` on the host; `pids`: its processes
    /// now). A sandbox watched again (resumed) keeps its journal.
    pub fn watch(&self, id: &str, id_base: u32, pids: Vec<u32>) {
        let mut st = self.shared.lock();
        if st.unavailable.is_some() {
            return;
        }
        st.sandboxes
            .entry(id.to_string())
            .or_insert_with(|| Ring {
                id_base,
                entries: VecDeque::new(),
                seq: 0,
            })
            .id_base = id_base;
        let tag: Arc<str> = Arc::from(id);
        st.adopt.extend(pids.into_iter().map(|p| (p, tag.clone())));
        if !st.running {
            st.running = true;
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("procwatch".into())
                .spawn(move || run(&shared));
            if let Err(e) = spawned {
                st.running = false;
                tracing::warn!(error = %e, "no thread to watch sandbox processes");
            }
        }
    }

    /// Forgets sandbox `id` and its journal (it was destroyed).
    pub fn forget(&self, id: &str) {
        self.shared.lock().sandboxes.remove(id);
    }

    /// The entries of sandbox `id` after `after`; `None` when it is not watched (unknown, or
    /// this host cannot watch).
    pub fn page(&self, id: &str, after: u64, limit: usize) -> Option<JournalPage> {
        let st = self.shared.lock();
        let ring = st.sandboxes.get(id)?;
        let oldest = ring.entries.front().map(|e| e.seq);
        let dropped = match oldest {
            Some(first) if first > after + 1 => first - after - 1,
            None if ring.seq > after => ring.seq - after,
            _ => 0,
        };
        let entries: Vec<JournalEntry> = ring
            .entries
            .iter()
            .filter(|e| e.seq > after)
            .take(limit.clamp(1, MAX_PAGE))
            .cloned()
            .collect();
        Some(JournalPage {
            boot: self.shared.boot.clone(),
            next: entries.last().map(|e| e.seq).unwrap_or(after),
            dropped,
            entries,
        })
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sandbox whose cgroup `path` is in, if this runtime has such a sandbox.
    fn sandbox_of<'a>(&self, path: &'a str) -> Option<&'a str> {
        let rest = path.strip_prefix(&self.prefix)?;
        let id = rest.split('/').next()?;
        (!id.is_empty()).then_some(id)
    }
}

impl State {
    fn record(
        &mut self,
        id: &str,
        kind: &'static str,
        level: Level,
        message: String,
        fields: BTreeMap<String, String>,
    ) {
        let Some(ring) = self.sandboxes.get_mut(id) else {
            return;
        };
        ring.seq += 1;
        ring.entries.push_back(JournalEntry {
            seq: ring.seq,
            at_ms: now_ms(),
            kind: kind.to_string(),
            level,
            message: cut(message),
            fields: fields.into_iter().map(|(k, v)| (k, cut(v))).collect(),
        });
        while ring.entries.len() > MAX_ENTRIES {
            ring.entries.pop_front();
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Cuts `s` to [`MAX_TEXT`] bytes on a character boundary, saying so.
fn cut(mut s: String) -> String {
    if s.len() <= MAX_TEXT {
        return s;
    }
    let mut end = MAX_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str("…[cut]");
    s
}

/// The watching thread: subscribes, then records until no sandbox is watched.
fn run(shared: &Shared) {
    let mut watcher = match Watcher::subscribe() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "process events unavailable: programs run in sandboxes are not journaled");
            let mut st = shared.lock();
            st.unavailable = Some(e.to_string());
            st.running = false;
            st.sandboxes.clear();
            return;
        }
    };
    let mut tracker: Tracker<Tag> = Tracker::new(TRACKED);
    loop {
        let events = match watcher.next_events(Duration::from_millis(500)) {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(error = %e, "reading process events");
                std::thread::sleep(Duration::from_secs(1));
                Vec::new()
            }
        };
        {
            let mut st = shared.lock();
            // Under the lock `watch` takes: a sandbox watched from now on starts a new thread.
            if st.sandboxes.is_empty() {
                st.running = false;
                st.adopt.clear();
                return;
            }
            for (pid, sandbox) in std::mem::take(&mut st.adopt) {
                tracker.adopt(
                    pid,
                    Tag {
                        sandbox,
                        pid: None,
                        program: String::new(),
                    },
                );
            }
        }
        for event in events {
            handle(shared, &mut tracker, event);
        }
    }
}

fn handle(shared: &Shared, tracker: &mut Tracker<Tag>, event: Event) {
    match event {
        Event::Fork { parent, child, .. } => {
            tracker.fork(parent, child);
        }
        Event::Exec { pid, at_ns } => {
            // Reading the cgroup first keeps the cost for the host's own processes to one read.
            let cgroups = procfs::cgroups(pid);
            let by_cgroup = cgroups.iter().find_map(|l| shared.sandbox_of(&l.path));
            let sandbox: Arc<str> = match (by_cgroup, tracker.get(pid)) {
                (Some(id), Some(t)) if *t.tag.sandbox == *id => t.tag.sandbox.clone(),
                (Some(id), _) => Arc::from(id),
                (None, Some(t)) => t.tag.sandbox.clone(),
                (None, None) => return,
            };
            let Some(id_base) = shared.lock().sandboxes.get(&*sandbox).map(|r| r.id_base) else {
                return;
            };
            let info = ProcInfo::read(pid);
            let parent = info.ppid.map(procfs::nspid);
            let (message, fields) = exec_entry(&info, parent.as_deref(), shared.depth, id_base);
            let tag = Tag {
                sandbox: sandbox.clone(),
                pid: info.nspid.get(shared.depth).copied(),
                program: info.argv.first().cloned().unwrap_or_default(),
            };
            tracker.exec(pid, at_ns, tag);
            shared
                .lock()
                .record(&sandbox, PROCESS_EXEC, Level::Info, message, fields);
        }
        Event::Exit { pid, at_ns, status } => {
            let Some(end) = tracker.exit(pid, at_ns) else {
                return;
            };
            // A process that only forked (never executed a program) is not in the journal.
            if end.ran.is_none() {
                return;
            }
            let (message, fields) = exit_entry(&end.tag, status, end.ran);
            shared
                .lock()
                .record(&end.tag.sandbox, PROCESS_EXIT, Level::Info, message, fields);
        }
        Event::Lost(n) => {
            // Whose they were is unknown: every watched sandbox's journal has the gap.
            let mut st = shared.lock();
            let ids: Vec<String> = st.sandboxes.keys().cloned().collect();
            for id in ids {
                st.record(
                    &id,
                    AGENT,
                    Level::Warn,
                    format!("{n} process events of the host lost (the kernel's buffer overflowed)"),
                    BTreeMap::new(),
                );
            }
        }
    }
}

/// The `process.exec` entry of `info`, in the sandbox's terms: pids from its pid namespace
/// (`depth` in `NSpid:`; `parent_nspid`: the parent's line), the uid less `id_base`.
fn exec_entry(
    info: &ProcInfo,
    parent_nspid: Option<&[u32]>,
    depth: usize,
    id_base: u32,
) -> (String, BTreeMap<String, String>) {
    let mut fields = BTreeMap::new();
    let pid = info.nspid.get(depth).copied();
    if let Some(pid) = pid {
        fields.insert("pid".into(), pid.to_string());
    }
    if let Some(parent) = parent_nspid {
        // A parent outside the sandbox's pid namespace is 0 inside, as the kernel shows it.
        let ppid = parent.get(depth).copied().unwrap_or(0);
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
        match uid.checked_sub(id_base).filter(|u| *u < ID_COUNT) {
            Some(inside) => fields.insert("uid".into(), inside.to_string()),
            // Not one of the sandbox's ids (a helper of the runtime entering it).
            None => fields.insert("host_uid".into(), uid.to_string()),
        };
    }
    let message = if info.argv.is_empty() {
        "exec (a process that ended before it was read)".to_string()
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
    if let Some(pid) = tag.pid {
        fields.insert("pid".into(), pid.to_string());
    }
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
    let program = match (&tag.program, tag.pid) {
        (p, _) if !p.is_empty() => p.clone(),
        (_, Some(pid)) => format!("pid {pid}"),
        _ => "a process".to_string(),
    };
    (format!("exit {program}: {how}"), fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_name_the_sandbox() {
        let w = HostWatch::new("warren");
        assert_eq!(w.shared.sandbox_of("/warren/abc"), Some("abc"));
        assert_eq!(w.shared.sandbox_of("/warren/abc/inner"), Some("abc"));
        assert_eq!(w.shared.sandbox_of("/warren/"), None);
        assert_eq!(w.shared.sandbox_of("/warrenx/abc"), None);
        assert_eq!(w.shared.sandbox_of("/user.slice/abc"), None);
        let nested = HostWatch::new("/a/b/");
        assert_eq!(nested.shared.sandbox_of("/a/b/s1"), Some("s1"));
    }

    #[test]
    fn an_exec_is_told_in_the_sandbox_s_ids() {
        let info = ProcInfo {
            pid: 5000,
            comm: "ls".into(),
            argv: vec!["ls".into(), "/".into()],
            argv_complete: true,
            cwd: Some("/home/user".into()),
            uid: Some(201_000),
            euid: Some(201_000),
            ppid: Some(4990),
            nspid: vec![5000, 12],
        };
        let (msg, f) = exec_entry(&info, Some(&[4990, 11]), 1, 200_000);
        assert_eq!(msg, "exec ls /");
        assert_eq!(
            (
                f["pid"].as_str(),
                f["ppid"].as_str(),
                f["uid"].as_str(),
                f["argv"].as_str()
            ),
            ("12", "11", "1000", r#"["ls","/"]"#)
        );
        // A parent outside the sandbox, and an id outside its range.
        let outsider = ProcInfo {
            uid: Some(0),
            ..info
        };
        let (_, f) = exec_entry(&outsider, Some(&[1]), 1, 200_000);
        assert_eq!(f["ppid"], "0");
        assert_eq!(f["host_uid"], "0");
        assert!(!f.contains_key("uid"));
    }

    #[test]
    fn rings_are_bounded_and_count_what_a_reader_missed() {
        let w = HostWatch::new("warren");
        {
            let mut st = w.shared.lock();
            st.sandboxes.insert(
                "s".into(),
                Ring {
                    id_base: 0,
                    entries: VecDeque::new(),
                    seq: 0,
                },
            );
            for i in 0..MAX_ENTRIES + 5 {
                st.record("s", AGENT, Level::Info, format!("m{i}"), BTreeMap::new());
            }
        }
        let p = w.page("s", 0, 10).unwrap();
        assert!(p.boot.starts_with("host-"));
        assert_eq!((p.dropped, p.entries[0].seq, p.next), (5, 6, 15));
        let p = w.page("s", p.next, 10_000).unwrap();
        assert_eq!((p.dropped, p.entries.len()), (0, MAX_PAGE));
        assert!(w.page("other", 0, 10).is_none());
        w.forget("s");
        assert!(w.page("s", 0, 10).is_none());
    }

    #[test]
    fn exits_give_code_or_signal_and_duration() {
        let tag = Tag {
            sandbox: Arc::from("s"),
            pid: Some(3),
            program: "false".into(),
        };
        let (msg, f) = exit_entry(&tag, ExitStatus::Exited(1), Some(Duration::from_millis(4)));
        assert_eq!(msg, "exit false: code 1");
        assert_eq!(
            (
                f["pid"].as_str(),
                f["exit_code"].as_str(),
                f["duration_ms"].as_str()
            ),
            ("3", "1", "4")
        );
        let (msg, _) = exit_entry(
            &tag,
            ExitStatus::Signaled {
                signal: 15,
                core: false,
            },
            None,
        );
        assert_eq!(msg, "exit false: signal 15");
    }
}

//! The connector on this kernel: programs started here are seen executing and ending, with
//! their argv and exit status. Needs root in the initial namespaces; skips (saying why)
//! elsewhere.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use warren_procwatch::{Event, ExitStatus, ProcInfo, Tracker, Watcher};

/// One test at a time: the overrun test's storm of programs would starve the others.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn watcher() -> Option<Watcher> {
    if !warren_testkit::require("root", warren_testkit::is_root()) {
        return None;
    }
    match Watcher::subscribe() {
        Ok(w) => Some(w),
        Err(e) => {
            warren_testkit::skip(format!(
                "the process events connector (root of the initial namespaces): {e}"
            ));
            None
        }
    }
}

/// What was seen of one process.
#[derive(Debug, Default, Clone)]
struct Seen {
    argvs: Vec<Vec<String>>,
    exit: Option<ExitStatus>,
    ran: Option<Duration>,
}

/// Follows the descendants of `root` until `done` holds or 10 s pass.
fn follow(
    w: &mut Watcher,
    root: u32,
    done: impl Fn(&HashMap<u32, Seen>) -> bool,
) -> HashMap<u32, Seen> {
    let mut tracker: Tracker<()> = Tracker::new(1000);
    tracker.adopt(root, ());
    let mut seen: HashMap<u32, Seen> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !done(&seen) {
        for ev in w.next_events(Duration::from_millis(200)).unwrap() {
            match ev {
                Event::Fork { parent, child, .. } => {
                    tracker.fork(parent, child);
                }
                Event::Exec { pid, at_ns } if tracker.get(pid).is_some() => {
                    tracker.exec(pid, at_ns, ());
                    let info = ProcInfo::read(pid);
                    seen.entry(pid).or_default().argvs.push(info.argv);
                }
                Event::Exit { pid, at_ns, status } => {
                    if let Some(end) = tracker.exit(pid, at_ns) {
                        if end.ran.is_some() {
                            let s = seen.entry(pid).or_default();
                            s.exit = Some(status);
                            s.ran = end.ran;
                        }
                    }
                }
                _ => {}
            }
        }
    }
    seen
}

#[test]
fn a_shell_and_its_programs_are_seen_executing_and_ending() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut w) = watcher() else { return };
    // The shell waits for a line on stdin before running anything, so that it is followed
    // (as this process's child) before it executes its programs.
    let mut child = Command::new("/bin/sh")
        .args([
            "-c",
            "read go; /bin/sleep 0.05; /bin/ls -R /usr/share > /dev/null; exec /bin/sh -c 'exit 3'",
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // The shell's own exec happened before we could follow it; everything after is seen.
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
    let seen = follow(&mut w, pid, |seen| {
        seen.get(&pid).is_some_and(|s| s.exit.is_some())
    });
    assert_eq!(child.wait().unwrap().code(), Some(3));
    let argvs: Vec<&Vec<String>> = seen.values().flat_map(|s| &s.argvs).collect();
    let has = |want: &[&str]| {
        argvs
            .iter()
            .any(|a| a.iter().map(String::as_str).eq(want.iter().copied()))
    };
    assert!(has(&["/bin/sleep", "0.05"]), "{seen:#?}");
    assert!(has(&["/bin/ls", "-R", "/usr/share"]), "{seen:#?}");
    // `exec` replaced the shell: the same process executed a second program, which ended
    // with status 3.
    let shell = &seen[&pid];
    assert_eq!(shell.exit, Some(ExitStatus::Exited(3)), "{seen:#?}");
    assert!(shell.ran.is_some());
    let sleep = seen
        .values()
        .find(|s| {
            s.argvs
                .iter()
                .any(|a| a.first().map(String::as_str) == Some("/bin/sleep"))
        })
        .unwrap();
    assert_eq!(sleep.exit, Some(ExitStatus::Exited(0)));
    assert!(sleep.ran.unwrap() >= Duration::from_millis(40), "{sleep:?}");
    assert_eq!(w.stats().lost, 0);
}

#[test]
fn a_killed_program_ends_with_its_signal() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut w) = watcher() else { return };
    let mut child = Command::new("/bin/sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    // The exec may have happened before we follow it; its end is what is tested here.
    let mut tracker: Tracker<()> = Tracker::new(10);
    tracker.exec(pid, 0, ());
    child.kill().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = None;
    while status.is_none() && Instant::now() < deadline {
        for ev in w.next_events(Duration::from_millis(200)).unwrap() {
            if let Event::Exit {
                pid: p, status: s, ..
            } = ev
            {
                if p == pid {
                    status = Some(s);
                }
            }
        }
    }
    let _ = child.wait();
    assert_eq!(
        status,
        Some(ExitStatus::Signaled {
            signal: 9,
            core: false
        })
    );
}

#[test]
fn an_overrun_is_counted_and_watching_goes_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut w) = watcher() else { return };
    // Thousands of events while nobody reads: far more than a small buffer holds (each event
    // takes about 800 bytes of it).
    w.set_receive_buffer(32 << 10).unwrap();
    let status = Command::new("/bin/sh")
        .args([
            "-c",
            "i=0; while [ $i -lt 3000 ]; do /bin/true; i=$((i+1)); done",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    // Lost events, as the watcher tells them.
    let mut lost = 0;
    let mut read = |w: &mut Watcher, wait: Duration| -> Vec<Event> {
        let events = w.next_events(wait).unwrap();
        lost += events
            .iter()
            .map(|e| if let Event::Lost(n) = e { *n } else { 0 })
            .sum::<u64>();
        events
    };
    while !read(&mut w, Duration::from_millis(200)).is_empty() {}
    if w.stats().overruns == 0 {
        warren_testkit::skip(format!(
            "a socket buffer too large to overrun with 3000 programs ({} messages arrived)",
            w.stats().messages
        ));
        return;
    }
    // Still watching: a new program is seen.
    let mut child = Command::new("/bin/sleep").arg("0.05").spawn().unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ended = false;
    while !ended && Instant::now() < deadline {
        for ev in read(&mut w, Duration::from_millis(200)) {
            ended |= matches!(ev, Event::Exit { pid: p, .. } if p == pid);
        }
    }
    child.wait().unwrap();
    assert!(ended, "no exit seen after the overrun");
    // Every event is either received or counted lost: 3000 forks, execs and exits at least
    // (the host's other processes add theirs). A loss is counted when the next event of the
    // same CPU arrives, so make some on every CPU.
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.stats().messages + w.stats().lost < 9000 && Instant::now() < deadline {
        Command::new("/bin/true").status().unwrap();
        read(&mut w, Duration::from_millis(20));
    }
    let stats = w.stats();
    eprintln!("after the overrun: {stats:?}");
    assert_eq!(lost, stats.lost, "every loss is told as an event");
    assert!(lost > 0, "{stats:?}");
    assert!(stats.messages + stats.lost >= 9000, "{stats:?}");
}

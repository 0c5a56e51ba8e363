//! Reaping sandboxes' PID 1s. The manager is the child subreaper of sandbox processes: when
//! a sandbox's `warren-nsinit` dies before its PID 1 (a kill reaches both at once), PID 1 is
//! handed to the manager and must be waited for, or it stays a zombie until the server exits.
//! PID 1 is waited for by a pidfd opened when it started, never by its number: once PID 1 is
//! reaped elsewhere its number may be given to a new child of ours (a `mount`), whose exit
//! belongs to that child's own waiter (pids wrap at 32768 on many hosts).

use std::fs;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// Waits for PID 1 if it became the manager's child. The kill reaches nsinit and PID 1 at once;
/// when nsinit dies first, PID 1 is handed to the nearest child subreaper, the manager, and
/// would stay a zombie of the server until the server exits. Bounded, for a PID 1 that
/// outlives the kill or an nsinit that outlived its wait: false when PID 1 is still there and
/// not ours to reap yet, and [`reap_unreaped`] must wait for it when it becomes ours.
pub(crate) fn reap_orphaned(pid1: &OwnedFd) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match reap(pid1) {
            Reap::Running => std::thread::sleep(Duration::from_millis(5)),
            Reap::Done => return true,
            Reap::NotOurs => return pidfd_reaped(pid1),
        }
    }
    false
}

pub(crate) enum Reap {
    /// Reaped now (or it cannot be waited for at all).
    Done,
    /// Our child, still running.
    Running,
    /// Not our child: nsinit's still, or already reaped by it.
    NotOurs,
}

/// Reaps the process of `pidfd` if it ended as our child. Waiting by pidfd never takes the
/// exit of a later process that got the same number.
pub(crate) fn reap(pidfd: &OwnedFd) -> Reap {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    use std::os::fd::AsFd;
    match waitid(
        Id::PIDFd(pidfd.as_fd()),
        WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG,
    ) {
        Ok(WaitStatus::StillAlive) => Reap::Running,
        Err(nix::errno::Errno::ECHILD) => Reap::NotOurs,
        _ => Reap::Done,
    }
}

/// Whether the process of `pidfd` has been reaped (by anyone): the kernel shows `Pid: -1` in
/// the descriptor's fdinfo once it has.
fn pidfd_reaped(pidfd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))
        .map(|info| {
            info.lines()
                .any(|l| l.split_whitespace().eq(["Pid:", "-1"]))
        })
        .unwrap_or(true)
}

pub(crate) fn open_pidfd(pid: u32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Killed sandboxes' PID 1s that were not ours to reap at the kill, with when they were left.
type Unreaped = Vec<(OwnedFd, Instant)>;
static UNREAPED: std::sync::Mutex<Unreaped> = std::sync::Mutex::new(Vec::new());

fn lock_unreaped() -> std::sync::MutexGuard<'static, Unreaped> {
    UNREAPED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps a killed sandbox's PID 1 that [`reap_orphaned`] could not reap yet.
pub(crate) fn leave(pid1: OwnedFd) {
    lock_unreaped().push((pid1, Instant::now()));
}

/// Reaps the killed sandboxes' PID 1s that have since become the manager's children and
/// ended, and forgets those reaped elsewhere (or left for over ten minutes: their nsinit
/// would have ended long before). Called at every SIGCHLD.
pub(crate) fn reap_unreaped() {
    lock_unreaped().retain(|(fd, since)| match reap(fd) {
        Reap::Done => false,
        Reap::Running => true,
        Reap::NotOurs => !pidfd_reaped(fd) && since.elapsed() < Duration::from_secs(600),
    });
}

/// Reaps any sandbox agent (a sandbox's PID 1, `warren-agent`) that ended as our child and
/// that nothing above waited for: a last net, so that no `[warren-agent] <defunct>` stays
/// behind whatever path handed it to us. Only zombies are waited for (a zombie's number cannot
/// be given to another process until it is reaped), and only agents: the manager never spawns
/// one itself, so no other waiter expects their exit. Children are read from
/// `/proc/self/task/*/children`.
pub(crate) fn reap_stray_agents() {
    let Ok(tasks) = fs::read_dir("/proc/self/task") else {
        return;
    };
    for task in tasks.flatten() {
        let Ok(children) = fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let zombie = stat[close + 1..].trim_start().starts_with('Z');
            if zombie && &stat[open + 1..close] == "warren-agent" {
                let _ = nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(pid),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn pidfd_of(child: &std::process::Child) -> OwnedFd {
        open_pidfd(child.id()).expect("pidfd_open (Linux 5.3 or later)")
    }

    #[test]
    fn a_stray_agent_zombie_is_reaped_and_other_children_are_not() {
        let dir = std::env::temp_dir().join(format!("reap-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let agent = dir.join("warren-agent");
        fs::copy("/bin/true", &agent).unwrap();
        // Never waited for by its handle: what the test's reaper must do.
        #[allow(clippy::zombie_processes)]
        let stray = Command::new(&agent).spawn().unwrap().id();
        let mut other = Command::new("true").spawn().unwrap();
        let zombie = |pid: u32| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'))
                .unwrap_or(false)
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(zombie(stray) && zombie(other.id())) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(zombie(stray), "the agent ended");
        reap_stray_agents();
        assert!(
            !std::path::Path::new(&format!("/proc/{stray}")).exists(),
            "the agent's zombie was reaped"
        );
        assert!(
            zombie(other.id()),
            "another child's exit is left to its waiter"
        );
        assert!(other.wait().unwrap().success());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_ended_child_is_reaped_by_its_pidfd() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let fd = pidfd_of(&child);
        assert!(matches!(reap(&fd), Reap::Running));
        child.kill().unwrap();
        assert!(reap_orphaned(&fd), "a killed child of ours is reaped");
        assert!(pidfd_reaped(&fd));
        // Reaped: std's own wait finds nothing left to wait for.
        assert!(child.try_wait().is_err());
    }

    #[test]
    fn another_process_with_the_number_is_never_waited_for() {
        // A process that is not our child (the shell's): its pidfd is not ours to reap, and
        // once the shell reaps it the pidfd says so.
        let out = Command::new("sh")
            .args(["-c", "sleep 0.2 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = out;
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(out.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: u32 = line.trim().parse().unwrap();
        let fd = open_pidfd(grandchild).expect("the shell's sleep runs");
        assert!(matches!(reap(&fd), Reap::NotOurs));
        out.wait().unwrap();
        assert!(pidfd_reaped(&fd), "the shell reaped its sleep");
        assert!(reap_orphaned(&fd), "nothing of ours to wait for");
    }
}

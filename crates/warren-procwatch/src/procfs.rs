//! What `/proc/<pid>` says about a process that just executed a program: its argv, working
//! directory, owner, parent, pid in each pid namespace and cgroup. Reading never fails: a
//! process may end (or be reaped) between the event and the read, and then what could be read
//! is kept (a reaped process leaves nothing, a zombie its name, pids and cgroup).

use std::fs;
use std::path::{Path, PathBuf};

/// What was read of one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcInfo {
    /// As the reader sees it (the kernel's pid in the reader's pid namespace).
    pub pid: u32,
    /// The command name (`Name:`, at most 15 bytes), empty when unknown.
    pub comm: String,
    /// The arguments; `[comm]` when the command line could not be read (the process ended or
    /// is a zombie), empty when even the name is unknown.
    pub argv: Vec<String>,
    /// Whether `argv` is the real command line (false: made of `comm`).
    pub argv_complete: bool,
    pub cwd: Option<String>,
    /// Real and effective uid as the reader's user namespace sees them.
    pub uid: Option<u32>,
    pub euid: Option<u32>,
    /// As the reader sees it.
    pub ppid: Option<u32>,
    /// The pid in every pid namespace the process is in, the reader's first, its own last.
    pub nspid: Vec<u32>,
}

impl ProcInfo {
    /// Reads `/proc/<pid>`.
    pub fn read(pid: u32) -> Self {
        Self::read_in(Path::new("/proc"), pid)
    }

    /// Reads `<proc>/<pid>` (a fixture directory in tests).
    pub fn read_in(proc: &Path, pid: u32) -> Self {
        let dir = proc.join(pid.to_string());
        // The command line first: it is what matters most and what goes first when the
        // process ends (the kernel drops it with the address space).
        let argv = read_capped(&dir.join("cmdline"), MAX_CMDLINE)
            .map(|b| parse_cmdline(&b))
            .unwrap_or_default();
        let status = fs::read_to_string(dir.join("status"))
            .map(|s| parse_status(&s))
            .unwrap_or_default();
        let cwd = fs::read_link(dir.join("cwd"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        let comm = match status.name {
            Some(n) => n,
            None => fs::read_to_string(dir.join("comm"))
                .map(|c| c.trim_end_matches('\n').to_string())
                .unwrap_or_default(),
        };
        let argv_complete = !argv.is_empty();
        let argv = if argv_complete || comm.is_empty() {
            argv
        } else {
            vec![comm.clone()]
        };
        ProcInfo {
            pid,
            comm,
            argv,
            argv_complete,
            cwd,
            uid: status.uid,
            euid: status.euid,
            ppid: status.ppid,
            nspid: status.nspid,
        }
    }
}

/// Most bytes of a command line read: a process may pass megabytes of arguments, and every
/// exec of it would cost reading them all.
pub const MAX_CMDLINE: u64 = 32 << 10;

fn read_capped(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    fs::File::open(path)?.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// `argv` as a JSON array of at most about `max` bytes: arguments that do not fit are cut,
/// and the array then ends with `"…[cut]"`, so what is kept stays valid JSON.
pub fn argv_json(argv: &[String], max: usize) -> String {
    const CUT: &str = "…[cut]";
    let mut kept: Vec<String> = Vec::new();
    let mut used = 2;
    for a in argv {
        let quoted = serde_json_string(a);
        if used + quoted.len() + 1 > max.saturating_sub(CUT.len() + 4) {
            kept.push(serde_json_string(CUT));
            return format!("[{}]", kept.join(","));
        }
        used += quoted.len() + 1;
        kept.push(quoted);
    }
    format!("[{}]", kept.join(","))
}

/// `s` as a JSON string literal.
fn serde_json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The fields of `/proc/<pid>/status` this crate uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    pub name: Option<String>,
    pub ppid: Option<u32>,
    pub uid: Option<u32>,
    pub euid: Option<u32>,
    pub nspid: Vec<u32>,
}

/// Parses `/proc/<pid>/status` (`Name:`, `PPid:`, `Uid:` real/effective/saved/fs, `NSpid:`).
pub fn parse_status(text: &str) -> Status {
    let mut s = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key {
            // The name is the rest of the line after one tab: it may hold spaces.
            "Name" => s.name = Some(unescape_name(value.strip_prefix('\t').unwrap_or(value))),
            "PPid" => s.ppid = value.trim().parse().ok(),
            "Uid" => {
                let mut ids = value.split_whitespace().map(|v| v.parse::<u32>().ok());
                s.uid = ids.next().flatten();
                s.euid = ids.next().flatten();
            }
            "NSpid" => {
                s.nspid = value
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect()
            }
            _ => {}
        }
    }
    s
}

/// `Name:` escapes `\` as `\\` and newline as `\n`.
fn unescape_name(s: &str) -> String {
    s.replace("\\n", "\n").replace("\\\\", "\\")
}

/// Splits `/proc/<pid>/cmdline` (NUL-terminated arguments; a process that rewrote its
/// arguments may leave no terminator, or use spaces) into arguments, lossily as UTF-8.
pub fn parse_cmdline(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path` (v2: `0::path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLine {
    pub hierarchy: u32,
    pub controllers: String,
    /// Relative to the reader's cgroup namespace root, starting with `/`.
    pub path: String,
}

/// Parses `/proc/<pid>/cgroup`.
pub fn parse_cgroup(text: &str) -> Vec<CgroupLine> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy = parts.next()?.parse().ok()?;
            let controllers = parts.next()?.to_string();
            let path = parts.next()?.to_string();
            Some(CgroupLine {
                hierarchy,
                controllers,
                path,
            })
        })
        .collect()
}

/// The cgroups of `pid`; empty when it is gone.
pub fn cgroups(pid: u32) -> Vec<CgroupLine> {
    cgroups_in(Path::new("/proc"), pid)
}

/// The cgroups of `<proc>/<pid>`.
pub fn cgroups_in(proc: &Path, pid: u32) -> Vec<CgroupLine> {
    let path: PathBuf = proc.join(pid.to_string()).join("cgroup");
    fs::read_to_string(path)
        .map(|t| parse_cgroup(&t))
        .unwrap_or_default()
}

/// The `NSpid:` line of `pid` (empty when it is gone).
pub fn nspid(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| parse_status(&s).nspid)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tmy prog\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
        Ngid:\t0\nPid:\t4242\nPPid:\t4200\nTracerPid:\t0\nUid:\t101000\t101000\t101000\t101000\n\
        Gid:\t101000\t101000\t101000\t101000\nFDSize:\t64\nNStgid:\t4242\t7\nNSpid:\t4242\t7\n\
        NSpgid:\t4242\t7\nNSsid:\t4200\t1\n";

    #[test]
    fn status_gives_name_parent_owner_and_namespaced_pids() {
        let s = parse_status(STATUS);
        assert_eq!(s.name.as_deref(), Some("my prog"));
        assert_eq!(s.ppid, Some(4200));
        assert_eq!((s.uid, s.euid), (Some(101000), Some(101000)));
        assert_eq!(s.nspid, vec![4242, 7]);
        assert_eq!(parse_status("garbage\nUid:\tx\n"), Status::default());
        assert_eq!(
            parse_status("Name:\ta\\\\b\\nc\n").name.as_deref(),
            Some("a\\b\nc")
        );
    }

    #[test]
    fn cmdline_splits_on_nul_and_keeps_empty_arguments() {
        assert_eq!(parse_cmdline(b"ls\0-l\0\0/\0"), vec!["ls", "-l", "", "/"]);
        assert_eq!(parse_cmdline(b"rewritten title"), vec!["rewritten title"]);
        assert!(parse_cmdline(b"").is_empty());
        assert_eq!(parse_cmdline(b"\xff\0"), vec!["\u{fffd}"]);
    }

    #[test]
    fn argv_as_json_stays_valid_and_bounded() {
        let argv: Vec<String> = vec!["ls".into(), "a \"quoted\"\n".into()];
        let j = argv_json(&argv, 2048);
        assert_eq!(serde_json::from_str::<Vec<String>>(&j).unwrap(), argv);
        let long: Vec<String> = (0..1000).map(|i| format!("argument-{i}")).collect();
        let j = argv_json(&long, 2048);
        assert!(j.len() <= 2048, "{}", j.len());
        let back: Vec<String> = serde_json::from_str(&j).unwrap();
        assert_eq!(back.last().unwrap(), "…[cut]");
        assert_eq!(back[..back.len() - 1], long[..back.len() - 1]);
        // One argument longer than the bound.
        let j = argv_json(&["x".repeat(5000)], 2048);
        assert_eq!(
            serde_json::from_str::<Vec<String>>(&j).unwrap(),
            vec!["…[cut]"]
        );
    }

    #[test]
    fn cgroup_lines_of_both_versions_parse() {
        let v2 = parse_cgroup("0::/warren/sbx1\n");
        assert_eq!(
            v2,
            vec![CgroupLine {
                hierarchy: 0,
                controllers: String::new(),
                path: "/warren/sbx1".into()
            }]
        );
        let v1 = parse_cgroup("12:pids:/warren/a\n4:cpu,cpuacct:/warren/a\n1:name=systemd:/x:y\n");
        assert_eq!(v1.len(), 3);
        assert_eq!(v1[1].controllers, "cpu,cpuacct");
        // A path may itself hold colons.
        assert_eq!(v1[2].path, "/x:y");
    }

    #[test]
    fn a_gone_process_leaves_what_could_be_read() {
        let dir = std::env::temp_dir().join(format!("procwatch-fixture-{}", std::process::id()));
        let p = dir.join("77");
        fs::create_dir_all(&p).unwrap();
        // A zombie: no command line, but its status.
        fs::write(p.join("cmdline"), b"").unwrap();
        fs::write(p.join("status"), STATUS).unwrap();
        let info = ProcInfo::read_in(&dir, 77);
        assert_eq!(info.argv, vec!["my prog"]);
        assert!(!info.argv_complete);
        assert_eq!(info.nspid, vec![4242, 7]);
        assert_eq!(info.cwd, None);
        // Reaped: nothing at all, and no error.
        let none = ProcInfo::read_in(&dir, 78);
        assert!(none.argv.is_empty() && none.comm.is_empty() && none.nspid.is_empty());
        // Alive: the real command line.
        fs::write(p.join("cmdline"), b"/bin/sh\0-c\0true\0").unwrap();
        let alive = ProcInfo::read_in(&dir, 77);
        assert_eq!(alive.argv, vec!["/bin/sh", "-c", "true"]);
        assert!(alive.argv_complete);
        fs::remove_dir_all(&dir).unwrap();
    }
}

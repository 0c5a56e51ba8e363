//! Host settings that back up the sandboxes' own confinement, checked when a runtime starts.
//!
//! Sandboxes cannot reach io_uring or open sockets of rare protocol families (their seccomp
//! filter refuses both), but a kernel bug in the filter's path, or a future relaxation, should
//! not be the only lock. So the host should disable io_uring (`kernel.io_uring_disabled=2`)
//! and stop the kernel from autoloading the protocol modules behind most socket-family
//! exploits (`install <module> /bin/false` in `modprobe.d`). `scripts/setup.sh` installs both;
//! a host without them gets one warning at start naming what is missing and how to fix it.

use std::path::{Path, PathBuf};

/// Protocol modules a socket() of their family would autoload, none of which a sandbox host
/// needs, and which carry most public socket-family privilege escalations (DCCP, RDS, TIPC,
/// n_hdlc, the amateur-radio and legacy families, CAN, ATM, ...).
pub const RISKY_MODULES: &[&str] = &[
    "dccp",
    "sctp",
    "rds",
    "tipc",
    "n_hdlc",
    "ax25",
    "netrom",
    "rose",
    "x25",
    "appletalk",
    "ipx",
    "psnap",
    "p8022",
    "llc2",
    "decnet",
    "econet",
    "ieee802154",
    "can",
    "atm",
    "phonet",
];

/// Where modprobe reads its configuration, in its own order.
const MODPROBE_DIRS: &[&str] = &[
    "/etc/modprobe.d",
    "/run/modprobe.d",
    "/usr/local/lib/modprobe.d",
    "/usr/lib/modprobe.d",
    "/lib/modprobe.d",
];

/// What the host lacks, as sentences for the operator; empty when it has everything.
pub fn missing() -> Vec<String> {
    let mut out = Vec::new();
    match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        Ok(v) if v.trim() != "2" => out.push(format!(
            "kernel.io_uring_disabled is {} (want 2: io_uring off for every process)",
            v.trim()
        )),
        _ => {}
    }
    if let Some(open) = autoloadable(
        Path::new("/proc/modules").exists(),
        read_flag("/proc/sys/kernel/modules_disabled"),
        &modprobe_config(),
    ) {
        if !open.is_empty() {
            out.push(format!(
                "the kernel may autoload these protocol modules: {} (want `install <module> \
                 /bin/false` for each in /etc/modprobe.d)",
                open.join(", ")
            ));
        }
    }
    out
}

/// Logs one warning naming whatever [`missing`] finds.
pub fn warn_if_missing() {
    let missing = missing();
    if !missing.is_empty() {
        tracing::warn!(
            missing = %missing.join("; "),
            "this host lacks settings that back up sandbox confinement; scripts/setup.sh \
             installs them (docs/security.md, \"Host prerequisites\")"
        );
    }
}

fn read_flag(path: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1")
}

/// Every modprobe configuration file's text, in modprobe's precedence (a file name in an
/// earlier directory hides the same name in later ones).
fn modprobe_config() -> Vec<(PathBuf, String)> {
    let mut seen = std::collections::BTreeSet::new();
    let mut files = Vec::new();
    for dir in MODPROBE_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        names.sort();
        for p in names {
            let Some(name) = p.file_name().map(|n| n.to_os_string()) else {
                continue;
            };
            if p.extension().is_some_and(|e| e == "conf") && seen.insert(name) {
                if let Ok(text) = std::fs::read_to_string(&p) {
                    files.push((p, text));
                }
            }
        }
    }
    files
}

/// The risky modules the kernel could still autoload, or `None` when it loads none at all (no
/// module support, or loading turned off).
fn autoloadable(
    has_modules: bool,
    modules_disabled: bool,
    config: &[(PathBuf, String)],
) -> Option<Vec<String>> {
    if !has_modules || modules_disabled {
        return None;
    }
    let mut blocked = std::collections::BTreeSet::new();
    for (_, text) in config {
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                // `install m /bin/false` (or true): loading m runs that instead.
                (Some("install"), Some(m), Some(cmd))
                    if cmd.ends_with("/false") || cmd.ends_with("/true") =>
                {
                    blocked.insert(normal(m));
                }
                // `blacklist m` stops loading by alias, which is how autoload finds it.
                (Some("blacklist"), Some(m), _) => {
                    blocked.insert(normal(m));
                }
                _ => {}
            }
        }
    }
    Some(
        RISKY_MODULES
            .iter()
            .filter(|m| !blocked.contains(&normal(m)))
            .map(|m| m.to_string())
            .collect(),
    )
}

/// modprobe treats `-` and `_` in module names alike.
fn normal(m: &str) -> String {
    m.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(text: &str) -> Vec<(PathBuf, String)> {
        vec![(PathBuf::from("/etc/modprobe.d/x.conf"), text.to_string())]
    }

    #[test]
    fn a_kernel_without_modules_or_with_loading_off_autoloads_nothing() {
        assert_eq!(autoloadable(false, false, &[]), None);
        assert_eq!(autoloadable(true, true, &[]), None);
    }

    #[test]
    fn an_unconfigured_host_can_autoload_every_risky_module() {
        assert_eq!(
            autoloadable(true, false, &[]).unwrap().len(),
            RISKY_MODULES.len()
        );
    }

    #[test]
    fn install_false_and_blacklist_block_and_comments_do_not() {
        let text = "install dccp /bin/false\nblacklist sctp\n# install rds /bin/false\n\
                    install tipc /usr/bin/true\ninstall can /sbin/modprobe --ignore-install can\n";
        let open = autoloadable(true, false, &conf(text)).unwrap();
        for m in ["dccp", "sctp", "tipc"] {
            assert!(!open.contains(&m.to_string()), "{m} is blocked: {open:?}");
        }
        for m in ["rds", "can", "atm"] {
            assert!(open.contains(&m.to_string()), "{m} is open: {open:?}");
        }
    }

    #[test]
    fn the_file_setup_installs_blocks_them_all() {
        let text = include_str!("../../../scripts/modprobe-warren.conf");
        assert_eq!(
            autoloadable(true, false, &conf(text)).unwrap(),
            Vec::<String>::new()
        );
    }
}

//! Test-only helpers shared by every crate's tests (a dev-dependency, never linked into a
//! product binary).
//!
//! The one rule for a test that needs something the host lacks (root, QEMU, `nft`, user
//! xattrs, ...): it prints `SKIP: <reason>` and returns early, so `cargo test` on a developer's
//! machine stays green and says what it did not run. With `WARREN_REQUIRE_ALL=1` (which
//! `scripts/test.sh` sets) the same check fails the test with the reason instead: there,
//! everything was installed, so a missing piece is a broken setup, not a reason to pass.
//!
//! Rust's test harness has no runtime skip, so a skipped test is reported as passed; the
//! `SKIP:` line is written straight to the process's stderr, past the harness's output
//! capture, so it shows up in a normal `cargo test` run.
//!
//! ```no_run
//! if !warren_testkit::require("qemu-system-x86_64 (scripts/setup.sh installs it)",
//!     warren_testkit::on_path("qemu-system-x86_64").is_some()) {
//!     return;
//! }
//! ```

pub mod net;

use std::fmt::Display;
use std::io::Write as _;
use std::path::PathBuf;

/// The variable that turns every skip into a failure.
pub const REQUIRE_ALL: &str = "WARREN_REQUIRE_ALL";

/// Whether skips are failures here (`WARREN_REQUIRE_ALL=1`).
pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL).as_deref() == Ok("1")
}

/// Returns `ok`. When it is false, the test cannot run on this host for want of `what`:
/// prints `SKIP: needs <what>` (the caller then returns), or, under `WARREN_REQUIRE_ALL=1`,
/// panics with that reason.
#[track_caller]
pub fn require(what: impl Display, ok: bool) -> bool {
    require_in(require_all(), what, ok)
}

/// The test cannot run on this host, for the given reason: prints `SKIP: <reason>` (the
/// caller then returns), or, under `WARREN_REQUIRE_ALL=1`, panics with the reason.
#[track_caller]
pub fn skip(reason: impl Display) {
    skip_in(require_all(), reason)
}

#[track_caller]
fn require_in(require_all: bool, what: impl Display, ok: bool) -> bool {
    if !ok {
        skip_in(require_all, format_args!("needs {what}"));
    }
    ok
}

#[track_caller]
fn skip_in(require_all: bool, reason: impl Display) {
    if require_all {
        panic!("{REQUIRE_ALL}=1 but this test cannot run here: {reason}");
    }
    // Straight to the stderr handle: the harness captures `eprintln!` of passing tests, and
    // a skip must be seen.
    let name = std::thread::current()
        .name()
        .map(|n| format!("{n}: "))
        .unwrap_or_default();
    let _ = writeln!(std::io::stderr(), "SKIP: {name}{reason}");
}

/// Whether the test runs as root (effective uid 0).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The first `tool` on `PATH` or in the sbin/bin directories (`ip`, `nft` and `mkfs.erofs`
/// live in `/usr/sbin`, which a non-root `PATH` often lacks).
pub fn on_path(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_print_and_return_unless_everything_is_required() {
        assert!(require_in(false, "nothing", true));
        assert!(!require_in(false, "a thing this host lacks", false));
        assert!(
            require_in(true, "nothing", true),
            "a met requirement never fails"
        );
        let failed =
            std::panic::catch_unwind(|| require_in(true, "a thing this host lacks", false));
        let message = failed.expect_err("a missing requirement fails under WARREN_REQUIRE_ALL=1");
        let message = message
            .downcast_ref::<String>()
            .expect("panic message is a String");
        assert!(
            message.contains("needs a thing this host lacks"),
            "{message}"
        );
    }

    #[test]
    fn tools_are_found_on_the_path_and_in_sbin() {
        assert!(on_path("sh").is_some());
        assert!(on_path("no-such-tool-warren-testkit").is_none());
    }
}

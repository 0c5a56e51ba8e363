//! Build progress reporting. A first build takes a minute or two (mostly downloading from the
//! Debian archive), so whoever triggered it — the CLI, the server's template endpoint, a test —
//! gets told what is happening instead of staring at a silent process.

use std::io::Write as _;
use std::time::Instant;

/// The stages of a build, in the order they happen. A cache hit reports none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuildPhase {
    /// Another process (or thread) holds the build lock for this recipe; we wait and then
    /// reuse its result.
    WaitingForLock,
    /// Checking root, tools, leftovers of crashed builds.
    Prepare,
    /// mmdebstrap downloads and installs the packages into a directory.
    Bootstrap,
    /// Our post-steps: accounts, sudoers, hostname, resolv.conf, clean-up.
    Configure,
    /// mkfs.erofs packs the tree into the image file.
    MakeImage,
    /// Header check, digest, package list, manifest.
    Verify,
    /// Atomic rename into the cache.
    Commit,
}

impl BuildPhase {
    /// Short stable name for logs and UIs.
    pub fn name(self) -> &'static str {
        match self {
            BuildPhase::WaitingForLock => "waiting-for-lock",
            BuildPhase::Prepare => "prepare",
            BuildPhase::Bootstrap => "bootstrap",
            BuildPhase::Configure => "configure",
            BuildPhase::MakeImage => "make-image",
            BuildPhase::Verify => "verify",
            BuildPhase::Commit => "commit",
        }
    }
}

impl std::fmt::Display for BuildPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Receives progress of an image build. Called on the thread that called
/// [`crate::ensure_image`], so implementations need not be thread-safe.
pub trait BuildProgress {
    /// A new phase starts; `detail` says what it is about to do, in words.
    fn phase(&mut self, phase: BuildPhase, detail: &str);

    /// One line of output from a build command (mmdebstrap, useradd, mkfs.erofs) or a note
    /// from the builder itself. Lines arrive as they are produced.
    fn log(&mut self, line: &str) {
        let _ = line;
    }
}

/// Prints phases (and, if verbose, every log line) to stderr, with the time since the first
/// phase. This is what a human running a build wants by default.
#[derive(Debug)]
pub struct StderrProgress {
    verbose: bool,
    started: Option<Instant>,
}

impl StderrProgress {
    /// Phases only.
    pub fn new() -> Self {
        StderrProgress {
            verbose: false,
            started: None,
        }
    }

    /// Phases and every line of command output.
    pub fn verbose() -> Self {
        StderrProgress {
            verbose: true,
            started: None,
        }
    }

    fn elapsed(&mut self) -> f64 {
        self.started
            .get_or_insert_with(Instant::now)
            .elapsed()
            .as_secs_f64()
    }
}

impl Default for StderrProgress {
    fn default() -> Self {
        StderrProgress::new()
    }
}

impl BuildProgress for StderrProgress {
    fn phase(&mut self, phase: BuildPhase, detail: &str) {
        let t = self.elapsed();
        // Progress is best effort: a closed stderr must not fail the build.
        let _ = writeln!(std::io::stderr(), "[image +{t:6.1}s] {phase}: {detail}");
    }

    fn log(&mut self, line: &str) {
        if self.verbose {
            let t = self.elapsed();
            let _ = writeln!(std::io::stderr(), "[image +{t:6.1}s]   {line}");
        }
    }
}

/// Discards everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct SilentProgress;

impl BuildProgress for SilentProgress {
    fn phase(&mut self, _phase: BuildPhase, _detail: &str) {}
}

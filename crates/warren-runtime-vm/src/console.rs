//! Waiting for a booting guest's console to say its agent listens. Woken by inotify on the
//! console's directory as QEMU writes it; a slow poll only where inotify is not available.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use inotify::{Inotify, WatchMask};
use tokio::io::unix::AsyncFd;

use crate::error::Result;
use crate::snapshot::VmFiles;

/// How often the console is read where inotify cannot tell of changes.
const FALLBACK_POLL: Duration = Duration::from_millis(100);

/// Waits until the console shows `ready`; fails when QEMU exits first or `timeout` passes.
pub(crate) async fn wait_for(
    files: &VmFiles,
    child: &mut tokio::process::Child,
    ready: &str,
    timeout: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    // Watching starts before the first read, so no write falls between the two.
    let mut changes = Changes::watch(&files.console);
    let mut scan = Scan::new(&files.console, ready);
    let mut can_wait = true;
    loop {
        if scan.found() {
            return Ok(());
        }
        tokio::select! {
            status = child.wait(), if can_wait => match status {
                // What it wrote before it exited still counts.
                Ok(_) if scan.found() => return Ok(()),
                Ok(status) => {
                    return Err(files.died(format!("QEMU exited during boot ({status})")))
                }
                // Not waitable (never happens for a child we spawned): the deadline decides.
                Err(e) => {
                    tracing::warn!(error = %e, "cannot wait for the booting QEMU");
                    can_wait = false;
                }
            },
            () = changes.next() => {}
            () = tokio::time::sleep_until(deadline) => {
                if scan.found() {
                    return Ok(());
                }
                return Err(files.died(format!(
                    "the guest agent did not start within {}s",
                    timeout.as_secs()
                )));
            }
        }
    }
}

/// News of writes to a file: inotify on its directory (the file may not exist yet), or a
/// timer where inotify cannot be had.
enum Changes {
    Inotify(AsyncFd<Inotify>),
    Poll,
}

impl Changes {
    fn watch(file: &Path) -> Self {
        match Self::inotify(file) {
            Ok(fd) => Self::Inotify(fd),
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "no inotify; polling the console");
                Self::Poll
            }
        }
    }

    fn inotify(file: &Path) -> std::io::Result<AsyncFd<Inotify>> {
        let dir = file.parent().unwrap_or(Path::new("."));
        let inotify = Inotify::init()?;
        inotify.watches().add(
            dir,
            WatchMask::MODIFY | WatchMask::CREATE | WatchMask::MOVED_TO,
        )?;
        // SAFETY: the Inotify moves into the AsyncFd and keeps its descriptor open (and the
        // same) until the AsyncFd is dropped.
        unsafe { AsyncFd::register_with_interest(inotify, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
    }

    /// Returns after the next change (several writes may come as one).
    async fn next(&mut self) {
        let Self::Inotify(fd) = self else {
            return tokio::time::sleep(FALLBACK_POLL).await;
        };
        let mut buf = [0u8; 4096];
        loop {
            let mut guard = match fd.readable_mut().await {
                Ok(g) => g,
                Err(e) => return self.degrade(e),
            };
            match guard.try_io(|fd| fd.get_mut().read_events(&mut buf).map(drop)) {
                Ok(Ok(())) => return,
                Ok(Err(e)) => return self.degrade(e),
                // Spurious wake-up: readiness was cleared, wait again.
                Err(_would_block) => continue,
            }
        }
    }

    fn degrade(&mut self, e: std::io::Error) {
        tracing::warn!(error = %e, "inotify failed; polling the console");
        *self = Self::Poll;
    }
}

/// Reads a growing file from where it last stopped, looking for `needle`.
struct Scan {
    path: PathBuf,
    needle: Vec<u8>,
    /// Bytes of the file read so far.
    offset: u64,
    /// The last bytes read, enough to find a needle split across two reads.
    tail: Vec<u8>,
    found: bool,
}

impl Scan {
    fn new(path: &Path, needle: &str) -> Self {
        Self {
            path: path.to_path_buf(),
            needle: needle.as_bytes().to_vec(),
            offset: 0,
            tail: Vec::new(),
            found: false,
        }
    }

    /// Whether the file has shown the needle, reading what was added since the last call.
    fn found(&mut self) -> bool {
        if !self.found {
            self.found = self.read_more().unwrap_or(false);
        }
        self.found
    }

    fn read_more(&mut self) -> std::io::Result<bool> {
        let mut f = std::fs::File::open(&self.path)?;
        if f.metadata()?.len() < self.offset {
            // Truncated or replaced: start over.
            self.offset = 0;
            self.tail.clear();
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut new = Vec::new();
        f.read_to_end(&mut new)?;
        self.offset += new.len() as u64;
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(&new);
        let hit = window.windows(self.needle.len()).any(|w| w == self.needle);
        let keep = self.needle.len().saturating_sub(1).min(window.len());
        self.tail = window[window.len() - keep..].to_vec();
        Ok(hit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const READY: &str = "agent listening";

    fn files() -> (PathBuf, VmFiles) {
        let dir = std::env::temp_dir().join(format!("warren-console-{}", std::process::id()));
        let dir = dir.join(format!("{:?}", std::thread::current().id()).replace(['(', ')'], ""));
        let _ = std::fs::remove_dir_all(&dir);
        let files = VmFiles::new(&dir);
        std::fs::create_dir_all(files.console.parent().unwrap()).unwrap();
        (dir, files)
    }

    fn sleeper() -> tokio::process::Child {
        tokio::process::Command::new("sleep")
            .arg("1000")
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    #[tokio::test]
    async fn a_ready_line_written_in_pieces_after_the_wait_began_is_seen() {
        let (dir, files) = files();
        let mut child = sleeper();
        let console = files.console.clone();
        let writer = tokio::spawn(async move {
            let mut f = std::fs::File::create(&console).unwrap();
            f.write_all(b"[    0.1] booting\nagent lis").unwrap();
            tokio::task::yield_now().await;
            f.write_all(b"tening on port 49983\n").unwrap();
        });
        // The timeout only bounds a broken wait; it is not what the test measures.
        wait_for(&files, &mut child, READY, Duration::from_secs(120))
            .await
            .unwrap();
        writer.await.unwrap();
        assert!(matches!(
            Changes::watch(&files.console),
            Changes::Inotify(_)
        ));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_qemu_that_exits_before_the_agent_listens_fails_the_wait() {
        let (dir, files) = files();
        std::fs::write(&files.console, b"kernel panic\n").unwrap();
        let mut child = tokio::process::Command::new("false").spawn().unwrap();
        let e = wait_for(&files, &mut child, READY, Duration::from_secs(120))
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("QEMU exited during boot"), "{text}");
        assert!(
            text.contains("kernel panic"),
            "the console tail is kept: {text}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_needle_split_across_reads_is_found_once_complete() {
        let (dir, files) = files();
        let mut scan = Scan::new(&files.console, READY);
        assert!(!scan.found(), "no file yet");
        let mut f = std::fs::File::create(&files.console).unwrap();
        f.write_all(b"xx agent li").unwrap();
        assert!(!scan.found());
        f.write_all(b"stening").unwrap();
        assert!(scan.found());
        let _ = std::fs::remove_dir_all(dir);
    }
}

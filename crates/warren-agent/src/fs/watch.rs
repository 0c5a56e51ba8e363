//! Directory watchers on inotify, with the event semantics of envd (which uses fsnotify).
//!
//! A [`DirWatch`] owns one inotify instance: a watch on the directory and, when recursive, on
//! every directory below it (added as they appear). Each inotify event becomes one
//! `FilesystemEvent` per operation it carries. [`subscribe`] runs a watch for a `WatchDir`
//! stream; [`Watchers`] keeps the polling watchers of `CreateWatcher` and buffers their events
//! until `GetWatcherEvents` drains them. Dropping either ends the watch and closes the fd.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use warren_proto::filesystem::{EntryInfo, EventType, FilesystemEvent};

use super::entry::entry_info;
use crate::users::UserDb;
use warren_proto::connect::{Code, ConnectError};
use warren_proto::server::RpcResult;

pub use super::watchers::Watchers;

/// Most events a polling watcher keeps between two drains; older ones are dropped first.
pub const MAX_BUFFERED_EVENTS: usize = 10_000;

/// Most watchers (streaming and polling together) one agent runs at once. Each holds an
/// inotify instance, and the kernel counts those per user id across user namespaces
/// (`fs.inotify.max_user_instances`, often 128): unbounded, one sandbox could use up the
/// budget that other sandboxes, and the host, share.
pub const MAX_WATCHERS: usize = 32;

static ACTIVE_WATCHERS: AtomicUsize = AtomicUsize::new(0);

/// One of the [`MAX_WATCHERS`] places, held by a live [`DirWatch`] and freed when it drops.
struct WatchSlot(());

impl WatchSlot {
    fn acquire() -> RpcResult<WatchSlot> {
        ACTIVE_WATCHERS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_WATCHERS).then_some(n + 1)
            })
            .map(|_| WatchSlot(()))
            .map_err(|_| {
                ConnectError::new(
                    Code::ResourceExhausted,
                    format!(
                        "too many filesystem watchers: at most {MAX_WATCHERS} can be active at \
                         once; remove unused watchers (RemoveWatcher) or close WatchDir streams"
                    ),
                )
            })
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        ACTIVE_WATCHERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Events fsnotify subscribes to for Create, Write, Remove, Rename and Chmod.
fn base_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::DELETE
        | WatchMask::DELETE_SELF
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::MOVE_SELF
        | WatchMask::ATTRIB
}

/// What to watch, already resolved to an absolute path.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    pub root: PathBuf,
    pub recursive: bool,
    pub include_entry: bool,
    pub allow_network_mounts: bool,
}

/// The operations of one inotify event, in the order envd reports them.
pub fn ops_for(mask: EventMask) -> Vec<EventType> {
    let mut ops = Vec::new();
    if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
        ops.push(EventType::Create);
    }
    if mask.intersects(EventMask::MOVE_SELF | EventMask::MOVED_FROM) {
        ops.push(EventType::Rename);
    }
    if mask.contains(EventMask::ATTRIB) {
        ops.push(EventType::Chmod);
    }
    if mask.contains(EventMask::MODIFY) {
        ops.push(EventType::Write);
    }
    if mask.intersects(EventMask::DELETE | EventMask::DELETE_SELF) {
        ops.push(EventType::Remove);
    }
    ops
}

/// Event name of a path relative to the watched directory (`.` for the directory itself, as
/// Go's `filepath.Rel` gives).
fn event_name(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".to_string()
    } else {
        rel.to_string_lossy().into_owned()
    }
}

/// Whether a `statfs` filesystem magic is a network or FUSE filesystem, where inotify does not
/// see remote changes.
pub fn is_network_fs(magic: u32) -> bool {
    const NFS: u32 = 0x6969;
    const CIFS: u32 = 0xFF53_4D42;
    const SMB: u32 = 0x517B;
    const SMB2: u32 = 0xFE53_4D42;
    const FUSE: u32 = 0x6573_5546;
    matches!(magic, NFS | CIFS | SMB | SMB2 | FUSE)
}

/// Checks that `root` can be watched, as envd does before watching.
fn validate(opts: &WatchOptions) -> RpcResult<()> {
    let root = opts.root.display();
    let meta = std::fs::metadata(&opts.root).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => {
            ConnectError::not_found(format!("path {root} not found"))
        }
        _ => ConnectError::internal(format!("error statting path {root}: {e}")),
    })?;
    if !meta.is_dir() {
        return Err(ConnectError::invalid_argument(format!(
            "path {root} not a directory"
        )));
    }
    if !opts.allow_network_mounts {
        let fs = nix::sys::statfs::statfs(&opts.root).map_err(|e| {
            ConnectError::internal(format!("error checking mount status of {root}: {e}"))
        })?;
        // f_type is a signed word whose width varies by platform; the magics are 32-bit.
        if is_network_fs(fs.filesystem_type().0 as u32) {
            return Err(ConnectError::invalid_argument(format!(
                "cannot watch path on network filesystem: {root}"
            )));
        }
    }
    Ok(())
}

fn watch_error(what: &str, path: &Path, e: &io::Error) -> ConnectError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "error adding watch on {}: inotify watch limit reached (fs.inotify.max_user_watches)",
                path.display()
            ),
        )
    } else {
        ConnectError::internal(format!("{what} {}: {e}", path.display()))
    }
}

/// Result of registering a directory tree: new watches and, for trees that appeared while
/// watching, the paths found inside them (relative to the root).
#[derive(Default)]
struct Registered {
    dirs: Vec<(WatchDescriptor, PathBuf)>,
    found: Vec<PathBuf>,
}

/// Watches `rel` (relative to `root`) and every directory below it. With `report_contents`,
/// everything found below `rel` is listed for synthetic CREATE events: when `mkdir -p a/b/c`
/// or a move brings in a whole tree, inotify only reports its top.
///
/// Blocking; runs on the blocking pool. Directories that vanish meanwhile are skipped.
fn register_tree(
    watches: &mut Watches,
    root: &Path,
    rel: &Path,
    report_contents: bool,
) -> RpcResult<Registered> {
    let mut out = Registered::default();
    let mut stack = vec![rel.to_path_buf()];
    while let Some(dir_rel) = stack.pop() {
        let dir = root.join(&dir_rel);
        // ONLYDIR/DONT_FOLLOW: the walk never follows symlinks and must not end up watching a
        // file that replaced the directory in the meantime.
        let mask = base_mask() | WatchMask::ONLYDIR | WatchMask::DONT_FOLLOW;
        match watches.add(&dir, mask) {
            Ok(wd) => out.dirs.push((wd, dir_rel.clone())),
            Err(e) if vanished(&e) => continue,
            Err(e) => return Err(watch_error("error adding watch on", &dir, &e)),
        }
        let iter = match std::fs::read_dir(&dir) {
            Ok(it) => it,
            Err(e) if vanished(&e) => continue,
            Err(e) => {
                return Err(ConnectError::internal(format!(
                    "error reading directory {}: {e}",
                    dir.display()
                )))
            }
        };
        let mut children: Vec<(std::ffi::OsString, bool)> = iter
            .filter_map(Result::ok)
            .map(|e| {
                let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
                (e.file_name(), is_dir)
            })
            .collect();
        children.sort();
        for (name, is_dir) in children.into_iter().rev() {
            let child = dir_rel.join(&name);
            if report_contents {
                out.found.push(child.clone());
            }
            if is_dir {
                stack.push(child);
            }
        }
    }
    if report_contents {
        out.found.sort();
    }
    Ok(out)
}

/// Errors meaning the directory is gone (or was replaced by a non-directory).
fn vanished(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

/// A live watch of one directory (tree).
pub struct DirWatch {
    opts: WatchOptions,
    stream: EventStream<Vec<u8>>,
    watches: Watches,
    /// Watched directories by descriptor, as paths relative to the root ("" = the root).
    dirs: HashMap<WatchDescriptor, PathBuf>,
    /// Events decoded but not handed out yet (one inotify event can yield several).
    pending: VecDeque<FilesystemEvent>,
    users: Option<(UserDb, Instant)>,
    /// The flush sentinel's watch and the pipe end it reads (see [`DirWatch::flusher`]).
    sentinel: Option<(WatchDescriptor, std::fs::File)>,
    /// Flush sentinels seen so far.
    flushes: u64,
    _slot: WatchSlot,
}

/// What a watch hands out: an event, or word that every event queued before a flush
/// request has been handed out.
// Made and consumed one at a time (never stored), so boxing the event would only add an
// allocation per event.
#[allow(clippy::large_enum_variant)]
pub(super) enum Item {
    Event(FilesystemEvent),
    Flushed(u64),
}

/// Asks a [`DirWatch`] to catch up: a byte written here makes the kernel queue an event on the
/// watch's own inotify instance, after every event queued before it (one instance's queue is
/// ordered), so once the watch reports it, everything that happened before was handed out.
pub(super) struct Flusher {
    pipe: std::fs::File,
}

impl Flusher {
    pub(super) fn request(&self) -> io::Result<()> {
        use std::io::Write;
        match (&self.pipe).write(&[1]) {
            Ok(_) => Ok(()),
            // The pipe is full of requests the watch has not read yet: one more is pending.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl DirWatch {
    /// Validates `opts` and starts watching. Errors use the codes of §3.4.
    pub async fn start(opts: WatchOptions) -> RpcResult<DirWatch> {
        let slot = WatchSlot::acquire()?;
        let o = opts.clone();
        let (inotify, dirs) = tokio::task::spawn_blocking(move || -> RpcResult<_> {
            validate(&o)?;
            let inotify = Inotify::init()
                .map_err(|e| ConnectError::internal(format!("error creating watcher: {e}")))?;
            let mut watches = inotify.watches();
            // The root may be a symlink to a directory: follow it (the validation did too).
            let wd = watches
                .add(&o.root, base_mask() | WatchMask::ONLYDIR)
                .map_err(|e| watch_error("error adding path to watcher:", &o.root, &e))?;
            let mut dirs = vec![(wd, PathBuf::new())];
            if o.recursive {
                let subdirs = list_subdirs(&o.root)?;
                for sub in subdirs {
                    dirs.extend(register_tree(&mut watches, &o.root, &sub, false)?.dirs);
                }
            }
            Ok((inotify, dirs))
        })
        .await
        .map_err(|e| ConnectError::internal(format!("watcher setup failed: {e}")))??;
        let watches = inotify.watches();
        let stream = inotify
            .into_event_stream(vec![0u8; 64 * 1024])
            .map_err(|e| ConnectError::internal(format!("error creating watcher: {e}")))?;
        Ok(DirWatch {
            opts,
            stream,
            watches,
            dirs: dirs.into_iter().collect(),
            pending: VecDeque::new(),
            users: None,
            sentinel: None,
            flushes: 0,
            _slot: slot,
        })
    }

    /// Sets up the flush sentinel: a pipe whose writes this watch's inotify instance sees
    /// (through `/proc/self/fd`), so no file anywhere is involved.
    pub(super) fn flusher(&mut self) -> io::Result<Flusher> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(io::Error::from)?;
        let write = std::fs::File::from(write);
        let read = std::fs::File::from(read);
        use std::os::fd::AsRawFd;
        let path = format!("/proc/self/fd/{}", write.as_raw_fd());
        let wd = self.watches.add(&path, WatchMask::MODIFY)?;
        self.sentinel = Some((wd, read));
        Ok(Flusher { pipe: write })
    }

    /// The next event or flush report; an error is final, as for [`DirWatch::next`].
    pub(super) async fn next_item(&mut self) -> RpcResult<Item> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Ok(Item::Event(ev));
            }
            match self.stream.next().await {
                Some(Ok(raw)) => {
                    if self.sentinel.as_ref().is_some_and(|(wd, _)| *wd == raw.wd) {
                        self.read_sentinel();
                        return Ok(Item::Flushed(self.flushes));
                    }
                    self.handle(raw).await?
                }
                Some(Err(e)) => return Err(ConnectError::internal(format!("watcher error: {e}"))),
                None => return Err(ConnectError::internal("watcher closed unexpectedly")),
            }
        }
    }

    /// Empties the sentinel pipe (requests coalesce: one event may stand for several).
    fn read_sentinel(&mut self) {
        use std::io::Read;
        if let Some((_, pipe)) = &self.sentinel {
            let mut buf = [0u8; 512];
            while matches!((&*pipe).read(&mut buf), Ok(n) if n > 0) {}
        }
        self.flushes += 1;
    }

    /// The next event. An error is final: the watch is broken (e.g. the kernel queue
    /// overflowed and events were lost) and should be dropped.
    ///
    /// Not cancel-safe while a new directory tree is being registered; run it on a task of its
    /// own (as [`subscribe`] and [`Watchers`] do) rather than in a `select!`.
    pub async fn next(&mut self) -> RpcResult<FilesystemEvent> {
        loop {
            if let Item::Event(ev) = self.next_item().await? {
                return Ok(ev);
            }
        }
    }

    async fn handle(&mut self, ev: EventOwned) -> RpcResult<()> {
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            return Err(ConnectError::internal(
                "watcher error: inotify event queue overflowed, events were lost",
            ));
        }
        let Some(dir_rel) = self.dirs.get(&ev.wd).cloned() else {
            // A watch we already dropped (e.g. a subtree moved away): stale event.
            return Ok(());
        };
        if ev.mask.intersects(EventMask::IGNORED | EventMask::UNMOUNT) {
            self.dirs.remove(&ev.wd);
            return Ok(());
        }
        let about_dir_itself = ev.name.is_none();
        let is_root = dir_rel.as_os_str().is_empty();
        if about_dir_itself {
            // A removed subdirectory is reported by its parent's watch already.
            if ev.mask.contains(EventMask::DELETE_SELF) && !is_root {
                return Ok(());
            }
            if ev.mask.contains(EventMask::MOVE_SELF) {
                // Like fsnotify: a recursive watch ignores it (the parent reported the
                // rename); a plain watch reports RENAME and stops watching the moved dir.
                if self.opts.recursive {
                    return Ok(());
                }
                let _ = self.watches.remove(ev.wd.clone());
                self.dirs.remove(&ev.wd);
            }
        }
        let rel = match &ev.name {
            Some(n) => dir_rel.join(n),
            None => dir_rel,
        };
        for op in ops_for(ev.mask) {
            let event = self.event(&rel, op);
            self.pending.push_back(event);
        }
        if self.opts.recursive && ev.mask.contains(EventMask::ISDIR) && !about_dir_itself {
            if ev.mask.contains(EventMask::MOVED_FROM) {
                // The subtree left (or is about to reappear under a new name, reported as
                // MOVED_TO): its watches would report stale names, so drop them.
                self.unwatch_subtree(&rel);
            }
            if ev.mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                self.watch_new_tree(rel).await?;
            }
        }
        Ok(())
    }

    /// Starts watching a directory that appeared below the root, reporting what it already
    /// contains as CREATE events.
    async fn watch_new_tree(&mut self, rel: PathBuf) -> RpcResult<()> {
        let mut watches = self.watches.clone();
        let root = self.opts.root.clone();
        let reg =
            tokio::task::spawn_blocking(move || register_tree(&mut watches, &root, &rel, true))
                .await
                .map_err(|e| ConnectError::internal(format!("watcher error: {e}")))??;
        self.dirs.extend(reg.dirs);
        for found in reg.found {
            let event = self.event(&found, EventType::Create);
            self.pending.push_back(event);
        }
        Ok(())
    }

    fn unwatch_subtree(&mut self, rel: &Path) {
        let gone: Vec<WatchDescriptor> = self
            .dirs
            .iter()
            .filter(|(_, p)| p.starts_with(rel))
            .map(|(wd, _)| wd.clone())
            .collect();
        for wd in gone {
            // Fails only if the kernel dropped the watch already; either way it is gone.
            let _ = self.watches.remove(wd.clone());
            self.dirs.remove(&wd);
        }
    }

    fn event(&mut self, rel: &Path, op: EventType) -> FilesystemEvent {
        let entry = if self.opts.include_entry
            && matches!(op, EventType::Create | EventType::Write | EventType::Chmod)
        {
            self.entry(rel)
        } else {
            None
        };
        FilesystemEvent {
            name: event_name(rel),
            r#type: op as i32,
            entry,
        }
    }

    /// The entry of a path below the root; none if it is already gone.
    fn entry(&mut self, rel: &Path) -> Option<EntryInfo> {
        // Account names rarely change; re-reading /etc/passwd per event would be wasteful.
        let stale = self
            .users
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() > Duration::from_secs(5));
        if stale {
            self.users = Some((UserDb::load(), Instant::now()));
        }
        let users = self.users.as_ref().map(|(db, _)| db)?;
        let path = if rel.as_os_str().is_empty() {
            self.opts.root.clone()
        } else {
            self.opts.root.join(rel)
        };
        entry_info(&path, users).ok()
    }
}

/// Subdirectories directly below `root` (not following symlinks).
fn list_subdirs(root: &Path) -> RpcResult<Vec<PathBuf>> {
    let iter = std::fs::read_dir(root).map_err(|e| {
        ConnectError::internal(format!("error reading directory {}: {e}", root.display()))
    })?;
    let mut out: Vec<PathBuf> = iter
        .filter_map(Result::ok)
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| PathBuf::from(e.file_name()))
        .collect();
    out.sort();
    Ok(out)
}

/// The events of a watch running on its own task. Dropping it stops the watch.
pub struct EventFeed {
    rx: mpsc::Receiver<RpcResult<FilesystemEvent>>,
    task: JoinHandle<()>,
}

impl EventFeed {
    /// The next event or the watch's final error; cancel-safe.
    pub async fn recv(&mut self) -> RpcResult<FilesystemEvent> {
        self.rx
            .recv()
            .await
            .unwrap_or_else(|| Err(ConnectError::internal("watcher stopped")))
    }
}

impl Drop for EventFeed {
    fn drop(&mut self) {
        // The task may be parked in `DirWatch::next` forever on a quiet directory; aborting
        // drops the watch and closes the inotify fd right away.
        self.task.abort();
    }
}

/// Validates and starts a watch whose events arrive through the returned feed.
pub async fn subscribe(opts: WatchOptions) -> RpcResult<EventFeed> {
    let mut watch = DirWatch::start(opts).await?;
    // Bounded: a slow client makes the task wait, and inotify queues in the kernel meanwhile.
    let (tx, rx) = mpsc::channel(256);
    let task = tokio::spawn(async move {
        loop {
            let item = watch.next().await;
            let last = item.is_err();
            if tx.send(item).await.is_err() || last {
                return;
            }
        }
    });
    Ok(EventFeed { rx, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_inotify_masks_like_fsnotify() {
        assert_eq!(ops_for(EventMask::CREATE), vec![EventType::Create]);
        assert_eq!(
            ops_for(EventMask::CREATE | EventMask::ISDIR),
            vec![EventType::Create]
        );
        assert_eq!(ops_for(EventMask::MOVED_TO), vec![EventType::Create]);
        assert_eq!(ops_for(EventMask::MOVED_FROM), vec![EventType::Rename]);
        assert_eq!(ops_for(EventMask::MOVE_SELF), vec![EventType::Rename]);
        assert_eq!(ops_for(EventMask::MODIFY), vec![EventType::Write]);
        assert_eq!(ops_for(EventMask::ATTRIB), vec![EventType::Chmod]);
        assert_eq!(ops_for(EventMask::DELETE), vec![EventType::Remove]);
        assert_eq!(ops_for(EventMask::DELETE_SELF), vec![EventType::Remove]);
        assert!(ops_for(EventMask::CLOSE_WRITE | EventMask::OPEN).is_empty());
        assert_eq!(
            ops_for(EventMask::MODIFY | EventMask::ATTRIB | EventMask::CREATE),
            vec![EventType::Create, EventType::Chmod, EventType::Write]
        );
    }

    #[test]
    fn names_and_network_filesystems() {
        assert_eq!(event_name(Path::new("")), ".");
        assert_eq!(event_name(Path::new("a/b.txt")), "a/b.txt");
        assert!(is_network_fs(0x6969));
        assert!(is_network_fs(0xFF53_4D42));
        assert!(is_network_fs(0x6573_5546));
        assert!(!is_network_fs(0xEF53)); // ext4
        assert!(!is_network_fs(0x0102_1994)); // tmpfs
    }

    fn scratch() -> PathBuf {
        let d = std::env::temp_dir().join(format!("warren-watch-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    async fn next(w: &mut DirWatch) -> (String, EventType) {
        let ev = tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .expect("event in time")
            .unwrap();
        (ev.name, EventType::try_from(ev.r#type).unwrap())
    }

    #[tokio::test]
    async fn recursive_watch_follows_new_trees() {
        let d = scratch();
        let opts = WatchOptions {
            root: d.clone(),
            recursive: true,
            include_entry: false,
            allow_network_mounts: false,
        };
        let mut w = DirWatch::start(opts).await.unwrap();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        assert_eq!(next(&mut w).await, ("a".into(), EventType::Create));
        // Either inotify saw a/b (watch added in time) or the registration walk found it.
        assert_eq!(next(&mut w).await, ("a/b".into(), EventType::Create));
        std::fs::write(d.join("a/b/f"), b"x").unwrap();
        // Skips a possible duplicate of a/b (seen both by inotify and by the walk).
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let ev = next(&mut w).await;
            if ev.0 == "a/b/f" && !seen.contains(&ev) {
                seen.push(ev);
            }
        }
        assert_eq!(
            seen,
            vec![
                ("a/b/f".to_string(), EventType::Create),
                ("a/b/f".to_string(), EventType::Write)
            ]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn validation_errors() {
        let d = scratch();
        let opts = |root: PathBuf| WatchOptions {
            root,
            recursive: false,
            include_entry: false,
            allow_network_mounts: false,
        };
        let missing = DirWatch::start(opts(d.join("nope"))).await.err().unwrap();
        assert_eq!(missing.code, Code::NotFound);
        std::fs::write(d.join("f"), b"").unwrap();
        let file = DirWatch::start(opts(d.join("f"))).await.err().unwrap();
        assert_eq!(file.code, Code::InvalidArgument);
        let watchers = Watchers::default();
        assert_eq!(watchers.drain("x").await.unwrap_err().code, Code::NotFound);
        assert_eq!(watchers.remove("x").await.unwrap_err().code, Code::NotFound);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

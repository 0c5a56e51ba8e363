//! Directory watchers (inotify).

/// Polling watchers created by `CreateWatcher`, by id.
#[derive(Default)]
pub struct Watchers {}

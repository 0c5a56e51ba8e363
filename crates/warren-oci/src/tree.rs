//! The in-root tree operations live in `warren-template` (nsinit uses them too); the unpacker
//! and the builder's fix-ups use them from here.

pub(crate) use warren_template::tree::{invalid, is_dir_at, list, remove_any, resolve_dir};
pub use warren_template::ImageTree;

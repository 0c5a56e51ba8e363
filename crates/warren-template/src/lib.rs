//! Template root filesystem images, shared by every Warren runtime.
//!
//! A template image is described by a [`Recipe`] (Debian suite, variant, packages, post-steps),
//! built on first use with `mmdebstrap` and packed into a read-only erofs file with
//! `mkfs.erofs`, and cached under `<data_dir>/images/<name>-<hash12>/` keyed by a content hash
//! of the recipe. Every sandbox of the template reuses that one file:
//!
//! * the `ns` runtime mounts it read-only (erofs mounts straight from a file) and stacks a
//!   per-sandbox writable upper directory on top with overlayfs;
//! * the `vm` runtime hands the same file to QEMU as a read-only disk.
//!
//! The guest agent is not part of any image (rebuilding the agent must never invalidate one):
//! the ns runtime binds it read-only at [`AGENT_PATH_IN_GUEST`], the vm runtime writes it into
//! the writable layer of a template's snapshot.
//!
//! ```no_run
//! use std::path::Path;
//! use warren_template::{ensure_image, Recipe, StderrProgress};
//!
//! let image = ensure_image(&Recipe::base(), Path::new("/var/lib/warren"), &mut StderrProgress::new())?;
//! println!("rootfs at {}", image.image.display());
//! # Ok::<(), warren_template::ImageError>(())
//! ```
//!
//! This crate does no HTTP and needs no async runtime: builds are long, blocking, and run on
//! whatever thread the caller dedicates to them. See docs/images.md for the design.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod build;
mod built;
mod catalog;
mod command;
mod erofs;
mod error;
mod fsutil;
mod interp;
mod interp_full;
mod manifest;
mod pack;
mod progress;
mod recipe;
mod steps;
pub mod tree;

/// Where the agent binary appears inside every sandbox (never in an image).
pub const AGENT_PATH_IN_GUEST: &str = "/usr/local/bin/warren-agent";

pub use build::{cached_image, ensure_image, images_dir, ImagePath};
pub use built::{
    built_dir, built_template, commit_built, is_built_key, remove_built, BuiltConfig,
    BuiltTemplate, TEMPLATE_FILE,
};
pub use catalog::{
    launch, recipe, start_command, Launch, Ready, StartCommand, BUILT_READY_TIMEOUT, TEMPLATES,
};
pub use erofs::{verify_image, ErofsInfo, EROFS_MAGIC};
pub use error::{ImageError, Result};
pub use interp::{
    code_interpreter_start_argv, CODE_INTERPRETER_TEMPLATE, INTERP_LIB_DIR, INTERP_PORT,
};
pub use interp_full::CODE_INTERPRETER_FULL_TEMPLATE;
pub use manifest::{Manifest, IMAGE_FILE, MANIFEST_FILE};
pub use pack::pack_layers;
pub use progress::{BuildPhase, BuildProgress, SilentProgress, StderrProgress};
pub use recipe::{
    host_debian_arch, Compression, PostStep, Recipe, DEBIAN_MIRROR, FORMAT_VERSION, SHORT_HASH_LEN,
    USER_HOME,
};
pub use tree::ImageTree;

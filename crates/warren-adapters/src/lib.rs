//! The control plane's ports over the host's back ends: what `warren serve` hands
//! `Control::builder` besides the store and the runtime.
//!
//! - [`HostDisks`]: [`warren_control::VolumeDisks`] over this host's volumes
//!   ([`warren_volume::VolumeHost`]).
//! - [`HttpWebhookSender`]: [`warren_control::WebhookSender`], which signs and posts webhook
//!   deliveries over HTTP(S), refusing internal receivers unless allowed.
//!
//! The HTTP API (`warren-server`) only translates; nothing here knows a route.

mod volume_disks;
mod webhooks;

pub use volume_disks::HostDisks;
pub use webhooks::{signature, EncodeEvent, HttpWebhookSender};

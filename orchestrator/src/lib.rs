//! The Orchard Env orchestrator library; the `orchard` binary is a thin layer over it.
//!
//! - [`image`]: the image store: pulls from OCI/Docker registries and imports archives
//!   into a content-addressed store of unpacked layers.
//! - [`backend`]: where sandboxes run; [`backend::local`] drives runc over overlayfs.

pub mod backend;
pub mod image;

//! Sandbox backends. [`local`] runs sandboxes on this machine with runc over overlayfs.

pub mod local;

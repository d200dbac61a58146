//! Fixtures shared by the tests of the agent, the orchestrator and the end-to-end tests
//! under `tests/`, so that each is written once:
//!
//! - [`skip`]: whether a test may run here. A test that needs root and runc starts with
//!   [`require_runc!`] (one that only needs root, [`require_root!`]); as another user it
//!   prints `skipped: <test> needs root and runc` and returns, so a non-root
//!   `cargo test` passes and says what it did not check.
//! - [`agent`]: the static musl `orchard-agent` under test ([`agent_binary`]).
//! - [`images`]: the OCI layouts `make images` builds ([`image_layout`]).
//! - [`runc`]: the runc fixture: a [`Runc`] on its own `--root`, unique container ids,
//!   reaping a container's init, its cgroups, and per-process scratch directories
//!   removed at exit.
//! - [`rootfs`]: the host's static busybox installed into a root filesystem or layer.
//! - [`archive`]: the archives upload tests send ([`tar_gz`]).
//! - [`exec`]: exec requests ([`shell`], [`argv`]) and the time limit every call of a
//!   test keeps ([`within`], [`CALL_LIMIT`]).
//!
//! This crate is only ever a dev-dependency; it must not depend on the crates it tests,
//! so the orchestrator's and the agent's unit tests can use it too.

pub mod agent;
pub mod archive;
pub mod exec;
pub mod images;
pub mod rootfs;
pub mod runc;
pub mod skip;

pub use agent::agent_binary;
pub use archive::tar_gz;
pub use exec::{argv, block_on_own_runtime, shell, within, CALL_LIMIT};
pub use images::{image_layout, images_out};
pub use runc::{cgroup_dirs, remove_tree, scratch_dir, unique_id, Runc};
pub use skip::{is_root, skip_unless_root, skip_unless_root_and_runc};

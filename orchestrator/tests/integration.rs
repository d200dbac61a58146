//! Integration tests of the orchestrator crate: one test binary, shared `util`.
//! They need root, runc and the test images (`make images`). As another user the tests
//! that need root start with `orchard_test_support::require_runc!()` (or
//! `require_root!`), which prints `skipped: <test> needs root and runc` and passes.

mod adversarial;
mod cli;
mod end_to_end;
mod image_store;
#[cfg(feature = "kubernetes")]
mod kubernetes;
mod local_backend;
#[cfg(feature = "redis")]
mod redis;
mod server;
mod util;

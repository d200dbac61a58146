//! Integration tests of the orchestrator crate: one test binary, shared `util`.
//! They need root, runc and the test images (`make images`).

mod adversarial;
mod cli;
mod end_to_end;
mod image_store;
mod local_backend;
mod server;
mod util;

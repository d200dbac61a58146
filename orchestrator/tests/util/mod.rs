//! Shared fixtures: a real local registry with the test images, and sandbox helpers.
#![allow(dead_code)]

pub mod bench;
pub mod registry;
pub mod sandbox;
pub mod server;

//! Shared fixtures: a real local registry with the test images, and sandbox helpers.
#![allow(dead_code)]

pub mod bench;
pub mod registry;
pub mod sandbox;
pub mod server;

/// Mount points at or under `dir`, from /proc/mounts.
pub fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(1).map(str::to_string))
        .filter(|m| m.starts_with(&dir))
        .collect()
}

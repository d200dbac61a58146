//! The test images: OCI layouts that `make images` leaves in `images/out/`.

use std::path::{Path, PathBuf};

/// `images/out/`, where `make images` leaves the test image layouts.
pub fn images_out() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../images/out")).to_path_buf()
}

/// The layout `images/out/<name>`, failing clearly when `make images` has not run.
pub fn image_layout(name: &str) -> PathBuf {
    let path = images_out().join(name);
    assert!(
        path.join("index.json").is_file(),
        "{} is missing: run `make images` first (it builds the test images)",
        path.display()
    );
    path
}

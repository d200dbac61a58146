//! Tar upload and download (placeholder: being written).

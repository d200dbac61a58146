//! Image store tests (being written).

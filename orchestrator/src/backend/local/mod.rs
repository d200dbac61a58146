//! The local backend (placeholder: being written).

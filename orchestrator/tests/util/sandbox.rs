//! Sandbox fixtures and the leak audit (being written).

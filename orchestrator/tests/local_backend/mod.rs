//! Local backend tests (being written).

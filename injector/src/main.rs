//! `orchard-injector` (placeholder: being written).

fn main() {}

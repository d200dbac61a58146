//! The benchmark binaries' shared parts: the load generator (`orchard-load`, also
//! driven by `orchard-scale`), its plot, and percentiles.

pub mod host;
pub mod load;
pub mod plot;
pub mod stats;

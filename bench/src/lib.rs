//! The benchmark binaries' shared parts: the load generator (`orchard-load`, also
//! driven by `orchard-scale`), its plot, and percentiles; and, with the `backend`
//! feature, the local backend's benchmark ([`local_backend`]), which the orchestrator's
//! integration tests run (it needs the `orchard` library, which the binaries do not).

pub mod host;
pub mod load;
#[cfg(feature = "backend")]
pub mod local_backend;
pub mod plot;
pub mod stats;

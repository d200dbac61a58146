//! What every handler gets ([`AppState`]): the service, the accepted keys, and what
//! only the HTTP side keeps: the upload spools' bounds and the tenants' turns at
//! sending big job bodies.

use std::sync::Arc;

use super::job_body::ReadShares;
use super::listen::DEFAULT_BODY_TIMEOUT;
use crate::service::files::spool::{Spools, DEFAULT_UPLOAD_SPOOL_BYTES};
use crate::service::{Keys, Service};

/// What every handler gets.
#[derive(Clone)]
pub struct AppState {
    /// The service.
    pub service: Service,
    /// The accepted API keys.
    pub keys: Arc<Keys>,
    /// The compatible upload's spools and their bounds.
    pub spools: Arc<Spools>,
    /// Each tenant's turn at sending a big job's output.
    pub reads: Arc<ReadShares>,
}

impl AppState {
    /// The state of a router over `service` with the default bounds of upload spools
    /// (`orchard serve` sets its own from the configuration).
    pub fn new(service: Service, keys: Keys) -> AppState {
        let host = crate::image::gc::Budget::parse(DEFAULT_UPLOAD_SPOOL_BYTES).unwrap_or_default();
        let spools = Spools::new(&service.config().data_dir, host, DEFAULT_BODY_TIMEOUT);
        AppState {
            service,
            keys: Arc::new(keys),
            spools: Arc::new(spools),
            reads: Arc::new(ReadShares::start()),
        }
    }
}

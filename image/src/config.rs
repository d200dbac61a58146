//! [`StoreConfig`]: how the store reaches registries (mirrors, plain-HTTP hosts,
//! credentials, parallel downloads, which hosts pulls may reach).

use std::collections::HashMap;

use crate::credentials::Credentials;
use crate::targets::TargetPolicy;

/// Layers downloaded at once, across all pulls, by default.
const DEFAULT_PARALLEL_LAYERS: usize = 3;

/// How the store reaches registries.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Registry host (`docker.io`, `ghcr.io`, `127.0.0.1:5000`) to mirror endpoints
    /// (`http://127.0.0.1:5000`, `mirror.example.com`), tried in order before the
    /// registry itself. A mirror without a scheme gets HTTPS unless it is loopback or
    /// listed in `insecure_registries`.
    pub mirrors: HashMap<String, Vec<String>>,
    /// Hosts (`host` or `host:port`) reached over plain HTTP. Loopback always is.
    pub insecure_registries: Vec<String>,
    /// Credentials per registry host or mirror host (`host` or `host:port`).
    pub credentials: HashMap<String, Credentials>,
    /// Layers downloaded at once across all pulls.
    pub parallel_layers: usize,
    /// Which hosts pulls may reach (unrestricted by default; `orchard serve` restricts).
    pub targets: TargetPolicy,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            mirrors: HashMap::new(),
            insecure_registries: Vec::new(),
            credentials: HashMap::new(),
            parallel_layers: DEFAULT_PARALLEL_LAYERS,
            targets: TargetPolicy::default(),
        }
    }
}

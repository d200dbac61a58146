//! Registry credentials and the image GC policy. Credentials are the one setting whose
//! sources add up instead of the highest winning: a docker `config.json`, then the
//! file's `registry_auth`, `ORCHARD_REGISTRY_AUTH` and `--registry-auth`, each over
//! the one before for the hosts it names.

use std::collections::HashMap;
use std::time::Duration;

use super::args::ServeArgs;
use super::defaults::DEFAULT_IMAGE_GC_INTERVAL_S;
use super::error::ConfigError;
use super::sources::AuthLayers;
use crate::image::credentials;
use crate::image::gc::{Budget, GcPolicy};
use crate::image::Credentials;

/// Registry credentials and the image GC policy, resolved.
#[derive(Debug, Clone, Default)]
pub struct RegistryAndGc {
    /// Credentials per registry or mirror host.
    pub credentials: HashMap<String, Credentials>,
    /// Where credentials came from (files, flags), for the start-up log.
    pub credential_sources: Vec<String>,
    /// Credential helpers of the config.json that are not run (warned about).
    pub ignored_helpers: Vec<String>,
    /// The image store's disk budget and pass interval.
    pub gc: Option<GcPolicy>,
}

impl RegistryAndGc {
    /// The config.json (`s.registry_config`, else the default one when present), then
    /// `auth`'s entries, lowest first; and the GC policy of `s`.
    pub fn resolve(s: &ServeArgs, auth: AuthLayers) -> Result<RegistryAndGc, ConfigError> {
        let mut out = RegistryAndGc::default();
        let docker_config = s
            .registry_config
            .clone()
            .or_else(credentials::default_docker_config);
        if let Some(path) = docker_config {
            let parsed = credentials::load_docker_config(&path)?;
            out.credentials.extend(parsed.auths);
            out.ignored_helpers = parsed.helpers;
            out.credential_sources.push(path.display().to_string());
        }
        for (entries, what) in auth.0 {
            if !entries.is_empty() {
                out.credentials
                    .extend(credentials::parse_auth_entries(&entries, what)?);
                out.credential_sources.push(what.to_string());
            }
        }
        let budget = match s.image_disk_budget.as_deref() {
            Some(text) => Budget::parse(text).map_err(ConfigError::Invalid)?,
            None => Budget::Off,
        };
        let interval = s.image_gc_interval_s.unwrap_or(DEFAULT_IMAGE_GC_INTERVAL_S);
        if interval == 0 {
            return Err(ConfigError::Invalid(
                "image_gc_interval_s must be at least 1".into(),
            ));
        }
        out.gc = Some(GcPolicy {
            budget,
            interval: Duration::from_secs(interval),
        });
        Ok(out)
    }
}

//! The two choices that pick code rather than a number: which backend runs sandboxes
//! and where the shared state lives. Each part is a Cargo feature; choosing one this
//! build left out is refused here, naming the feature ([`ConfigError::NotCompiled`]).

use super::error::ConfigError;
use crate::backend::kubernetes::{KubeArgs, KubeConfig};

/// Where the shared state lives.
#[derive(Debug, Clone, PartialEq)]
pub enum StateChoice {
    /// This process's memory (and the job journal).
    Memory,
    /// A Redis shared by the replicas.
    Redis {
        /// Its URL.
        url: String,
        /// The prefix of the keys.
        prefix: String,
    },
}

impl StateChoice {
    /// `memory` (or nothing) or a Redis URL; the prefix a non-empty word.
    pub fn parse(state: Option<&str>, prefix: Option<String>) -> Result<StateChoice, ConfigError> {
        let prefix = prefix.unwrap_or_else(|| "orchard".into());
        if prefix.is_empty() || prefix.contains(char::is_whitespace) {
            return Err(ConfigError::Invalid(format!(
                "state_prefix {prefix:?}: must be a non-empty word"
            )));
        }
        match state.map(str::trim) {
            None | Some("") | Some("memory") => Ok(StateChoice::Memory),
            Some(url)
                if ["redis://", "rediss://", "redis+unix://", "unix://"]
                    .iter()
                    .any(|s| url.starts_with(s)) =>
            {
                if !cfg!(feature = "redis") {
                    return Err(ConfigError::NotCompiled {
                        setting: format!("state {url:?}"),
                        feature: "redis",
                        instead: "`memory`",
                    });
                }
                Ok(StateChoice::Redis {
                    url: url.to_string(),
                    prefix,
                })
            }
            Some(other) => Err(ConfigError::Invalid(format!(
                "state {other:?}: use `memory` or a Redis URL such as redis://127.0.0.1:6379"
            ))),
        }
    }
}

/// Which backend runs sandboxes.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendChoice {
    /// runc over overlayfs on this machine.
    Local,
    /// A pod per sandbox.
    Kubernetes(Box<KubeConfig>),
}

impl BackendChoice {
    /// `local` (or nothing) or `kubernetes` (`k8s`), with the Kubernetes settings.
    pub fn parse(backend: Option<&str>, kube: &KubeArgs) -> Result<BackendChoice, ConfigError> {
        match backend.unwrap_or("local") {
            "local" => Ok(BackendChoice::Local),
            name @ ("kubernetes" | "k8s") if !cfg!(feature = "kubernetes") => {
                Err(ConfigError::NotCompiled {
                    setting: format!("backend {name:?}"),
                    feature: "kubernetes",
                    instead: "local",
                })
            }
            "kubernetes" | "k8s" => Ok(BackendChoice::Kubernetes(Box::new(
                KubeConfig::resolve(kube).map_err(ConfigError::Invalid)?,
            ))),
            other => Err(ConfigError::Invalid(format!(
                "backend {other:?}: use local or kubernetes"
            ))),
        }
    }
}

//! The sources beneath the flags, each read into a [`ServeArgs`] of its own: the list
//! variables and the TOML file. clap reads the other variables itself (`#[arg(env)]`),
//! under the flags; [`layered`] lays the rest beneath them with the one merge.
//!
//! The environment is an [`Env`]: the process's, or a map, so a test gives its
//! variables without changing the process's (which every other thread reads).

use std::collections::HashMap;
use std::path::Path;

use merge::Merge;

use super::args::{Secret, ServeArgs};
use super::error::ConfigError;
use crate::backend::kubernetes::KubeArgs;

/// A list of keys as Orchard's `API_KEYS` takes them: separated by commas, spaces or
/// newlines, empty entries dropped.
pub fn split_keys(list: &str) -> Vec<String> {
    list.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
}

/// The environment variables a resolve reads itself.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// `None`: the process's.
    vars: Option<HashMap<String, String>>,
}

impl Env {
    /// The process's environment.
    pub fn process() -> Env {
        Env { vars: None }
    }

    /// A variable's value; one that is not Unicode counts as unset, as it always has.
    pub fn var(&self, name: &str) -> Option<String> {
        match &self.vars {
            None => std::env::var(name).ok(),
            Some(vars) => vars.get(name).cloned(),
        }
    }

    /// The list in the first of `names` that is set, split by `split`; `None` when
    /// none is set or the list is empty (a source beneath then gives it).
    fn list(&self, names: &[&str], split: fn(&str) -> Vec<String>) -> Option<Vec<String>> {
        let value = names.iter().find_map(|n| self.var(n))?;
        Some(split(&value)).filter(|l| !l.is_empty())
    }
}

impl From<HashMap<String, String>> for Env {
    fn from(vars: HashMap<String, String>) -> Env {
        Env { vars: Some(vars) }
    }
}

/// Entries separated by commas, blanks around them dropped (the Kubernetes lists).
fn split_commas(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Entries separated by whitespace (credentials, whose passwords may hold commas).
fn split_whitespace(list: &str) -> Vec<String> {
    list.split_whitespace().map(str::to_string).collect()
}

/// The variables of the repeatable settings, each holding a whole list (its flag's
/// help names it).
pub fn list_variables(env: &Env) -> ServeArgs {
    ServeArgs {
        api_keys: env.list(&["ORCHARD_API_KEYS", "API_KEYS"], split_keys),
        operator_keys: env.list(&["ORCHARD_OPERATOR_KEYS"], split_keys),
        allow_registries: env.list(&["ORCHARD_ALLOW_REGISTRIES"], split_keys),
        egress_allow_cidrs: env.list(&["ORCHARD_EGRESS_ALLOW_CIDRS"], split_keys),
        registry_auth: env
            .list(&["ORCHARD_REGISTRY_AUTH"], split_whitespace)
            .map(|l| l.into_iter().map(Secret).collect()),
        kube: KubeArgs {
            kube_ingress_cidrs: env.list(&["ORCHARD_KUBE_INGRESS_CIDRS"], split_commas),
            kube_ingress_pod_labels: env.list(&["ORCHARD_KUBE_INGRESS_POD_LABELS"], split_commas),
            kube_warm_pools: env.list(&["ORCHARD_KUBE_WARM_POOLS"], split_commas),
            ..KubeArgs::default()
        },
        ..ServeArgs::default()
    }
}

/// The file's settings (none without a file).
pub fn file(path: Option<&Path>) -> Result<ServeArgs, ConfigError> {
    let Some(path) = path else {
        return Ok(ServeArgs::default());
    };
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Registry credentials from each source, lowest first: they add up per host instead
/// of the highest source's list winning.
#[derive(Debug, Default)]
pub struct AuthLayers(pub Vec<(Vec<String>, &'static str)>);

/// The settings of `args` (flags over the variables clap reads), over the list
/// variables of `env`, over the file `args` names; and the credentials of each.
pub fn layered(mut args: ServeArgs, env: &Env) -> Result<(ServeArgs, AuthLayers), ConfigError> {
    let mut file = file(args.config.as_deref())?;
    let mut vars = list_variables(env);
    let mut auth = AuthLayers::default();
    for (layer, what) in [
        (&mut file, "registry_auth in the config file"),
        (&mut vars, "ORCHARD_REGISTRY_AUTH"),
        (&mut args, "--registry-auth"),
    ] {
        let entries = layer.registry_auth.take().unwrap_or_default();
        auth.0
            .push((entries.into_iter().map(|s| s.0).collect(), what));
    }
    args.merge(vars);
    args.merge(file);
    Ok((args, auth))
}

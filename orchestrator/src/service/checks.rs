//! The rules every create and job is checked against before anything is made: the
//! most labels, environment and lifetime one may ask for, and the label prefix kept for
//! the server's own metadata. A leaf of [`super`].

use std::collections::BTreeMap;

use super::error::{BadEnv, BadLabel, Error};

/// Label prefix of the server's own metadata on a backend sandbox.
pub(super) const META: &str = "orchard.";

/// Longest lifetime a create may ask for (`ttl_s`); 0 is "until deleted".
pub(super) const MAX_TTL_S: u64 = 100 * 365 * 86_400;

/// Most labels of one sandbox or snapshot (labels are kept in every record and
/// listed with it: issue 30 saw 822 MB of them).
pub const MAX_LABELS: usize = 64;
/// Most bytes of a create's or a job's environment, names and values together (what
/// a process can be given is about 2 MiB of arguments and environment in all).
pub const MAX_ENV_BYTES: usize = 256 << 10;

/// Environment variables and labels as every backend takes them: names without `=` or
/// NUL, at most [`MAX_ENV_BYTES`] in all; at most [`MAX_LABELS`] labels, keys of 1-128
/// characters of `A-Za-z0-9._-/`, values of at most 1024 bytes.
pub(super) fn validate_env_and_labels(
    env: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let env_bytes: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if env_bytes > MAX_ENV_BYTES {
        return Err(BadEnv::TooLarge {
            bytes: env_bytes,
            max: MAX_ENV_BYTES,
        }
        .into());
    }
    if labels.len() > MAX_LABELS {
        return Err(BadLabel::TooMany {
            count: labels.len(),
            max: MAX_LABELS,
        }
        .into());
    }
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(BadEnv::Malformed(k.clone()).into());
        }
        if k == "ORCHARD_AGENT_TOKEN" {
            return Err(BadEnv::Reserved(k.clone()).into());
        }
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= 128
            && k.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b'/'));
        if !key_ok {
            return Err(BadLabel::Key {
                key: k.clone(),
                max: 128,
            }
            .into());
        }
        if v.len() > 1024 {
            return Err(BadLabel::ValueTooLong {
                key: k.clone(),
                max: 1024,
            }
            .into());
        }
    }
    Ok(())
}

//! A sandbox's resource limits ([`Limits`]), as asked for and as its state file keeps
//! them, with their check. A leaf: the request, the state file and the error all use it.

use serde::{Deserialize, Serialize};

/// Limits no sandbox can run with; the backend answers it as
/// [`LocalError::Invalid`](super::error::LocalError::Invalid), a bad request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidLimits(pub String);

/// Resource limits of a sandbox. A `None` takes the backend's default
/// ([`LocalConfig::default_limits`](super::LocalConfig::default_limits)).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Limits {
    /// CPU cores (a CFS quota: 0.5 is half of one core's time).
    pub cpus: Option<f64>,
    /// Memory in bytes; no swap on top.
    pub memory_bytes: Option<u64>,
    /// Processes and threads, the agent's included.
    pub pids: Option<u64>,
    /// Size of the `/tmp` tmpfs in bytes (its pages count as the sandbox's memory).
    pub tmp_bytes: Option<u64>,
}

impl Limits {
    /// The backend's defaults: 1 CPU, 2 GiB, 2048 pids, 1 GiB `/tmp`.
    pub const DEFAULT: Limits = Limits {
        cpus: Some(1.0),
        memory_bytes: Some(2 << 30),
        pids: Some(2048),
        tmp_bytes: Some(1 << 30),
    };

    /// Each unset field taken from `defaults`.
    pub fn or(self, defaults: Limits) -> Limits {
        Limits {
            cpus: self.cpus.or(defaults.cpus),
            memory_bytes: self.memory_bytes.or(defaults.memory_bytes),
            pids: self.pids.or(defaults.pids),
            tmp_bytes: self.tmp_bytes.or(defaults.tmp_bytes),
        }
    }

    /// Checks each set limit is one a sandbox can run with.
    pub(super) fn validate(&self) -> Result<(), InvalidLimits> {
        if let Some(c) = self.cpus {
            if !c.is_finite() || !(0.01..=1024.0).contains(&c) {
                return Err(InvalidLimits(format!(
                    "cpus must be between 0.01 and 1024, got {c}"
                )));
            }
        }
        // The agent itself needs a few MiB and a dozen threads.
        if self.memory_bytes.is_some_and(|m| m < 16 << 20) {
            return Err(InvalidLimits("memory_bytes must be at least 16 MiB".into()));
        }
        if self.pids.is_some_and(|p| p < 16) {
            return Err(InvalidLimits("pids must be at least 16".into()));
        }
        if self.tmp_bytes.is_some_and(|t| t < 1 << 20) {
            return Err(InvalidLimits("tmp_bytes must be at least 1 MiB".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_default_field_by_field_and_are_validated() {
        let l = Limits {
            cpus: Some(0.5),
            ..Limits::default()
        }
        .or(Limits::DEFAULT);
        assert_eq!(l.cpus, Some(0.5));
        assert_eq!(l.memory_bytes, Limits::DEFAULT.memory_bytes);
        l.validate().unwrap();
        for bad in [
            Limits {
                cpus: Some(0.0),
                ..Limits::default()
            },
            Limits {
                memory_bytes: Some(1024),
                ..Limits::default()
            },
            Limits {
                pids: Some(2),
                ..Limits::default()
            },
        ] {
            assert!(matches!(bad.validate(), Err(InvalidLimits(_))));
        }
    }
}

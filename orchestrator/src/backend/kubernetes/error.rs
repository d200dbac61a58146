//! Errors of the Kubernetes backend, and their one mapping to [`BackendError`].
//!
//! The API server's answer decides the kind: 404 is `NotFound`, 409 `Exists`, 400 and
//! 422 (a spec the API refuses) `Invalid`; 403 is a configuration fault of the operator
//! (RBAC) and says so; 429, 5xx and transport errors are `Unavailable` (try again).

use crate::backend::BackendError;

/// What went wrong talking to Kubernetes.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// No credentials could be loaded (kubeconfig or in-cluster).
    #[error("Kubernetes credentials: {0}")]
    Credentials(String),
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done (`creating pod sb-1`).
        action: String,
        /// kube-rs's error.
        #[source]
        source: kube::Error,
    },
    /// The pod failed to start; the message carries Kubernetes' reason.
    #[error("{0}")]
    PodFailed(String),
    /// The pod did not become ready, or was not found ready, in time.
    #[error("{0}")]
    Timeout(String),
    /// A value the backend cannot turn into an object (a bad id, a quantity).
    #[error("{0}")]
    Invalid(String),
}

impl KubeError {
    /// An API error while doing `action`.
    pub fn api(action: impl Into<String>, source: kube::Error) -> KubeError {
        KubeError::Api {
            action: action.into(),
            source,
        }
    }

    /// The HTTP status of an API answer, if it was one.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            KubeError::Api {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }
}

/// Whether an API error is a 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether an API error is a 409 (already exists, or a conflicting update).
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The kind follows the variant and, for an API call, its answer's code; the
/// [`KubeError`] rides along as the cause (with kube-rs's error under it), but for 404
/// and 409, whose kinds are data (the text stands where the id would).
impl From<KubeError> for BackendError {
    fn from(e: KubeError) -> BackendError {
        let text = e.to_string();
        let code = e.status_code();
        match (&e, code) {
            (KubeError::Invalid(_), _) => BackendError::invalid_by(text, e),
            (KubeError::PodFailed(_), _) => BackendError::failed_by(text, e),
            (KubeError::Timeout(_) | KubeError::Credentials(_), _) => {
                BackendError::unavailable_by(text, e)
            }
            (KubeError::Api { .. }, Some(404)) => BackendError::NotFound(text),
            (KubeError::Api { .. }, Some(409)) => BackendError::Exists(text),
            (KubeError::Api { .. }, Some(400 | 422)) => BackendError::invalid_by(text, e),
            (KubeError::Api { .. }, Some(403)) => BackendError::failed_by(
                format!(
                    "{text} (the orchestrator's service account lacks this permission: \
                     see deploy/base/rbac.yaml)"
                ),
                e,
            ),
            (KubeError::Api { .. }, _) => BackendError::unavailable_by(text, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> KubeError {
        let status = kube::core::Status::failure("refused", "Reason").with_code(code);
        KubeError::api("creating pod sb-1", kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn api_codes_map_to_backend_kinds() {
        assert!(matches!(api(404).into(), BackendError::NotFound(_)));
        assert!(matches!(api(409).into(), BackendError::Exists(_)));
        assert!(matches!(api(422).into(), BackendError::Invalid { .. }));
        assert!(matches!(api(500).into(), BackendError::Unavailable { .. }));
        assert!(matches!(api(429).into(), BackendError::Unavailable { .. }));
        let BackendError::Failed { message: m, .. } = api(403).into() else {
            panic!("403 is a failure")
        };
        assert!(m.contains("creating pod sb-1") && m.contains("rbac"), "{m}");
    }

    /// The API's answer survives the mapping: under the backend's error, the
    /// [`KubeError`], and under it kube-rs's error with the status the API sent.
    #[test]
    fn the_api_error_survives_as_the_cause() {
        use std::error::Error as _;
        let err = BackendError::from(api(500));
        assert_eq!(
            err.to_string(),
            api(500).to_string(),
            "the message is unchanged"
        );
        let kube_error = err.source().and_then(|s| s.downcast_ref::<KubeError>());
        assert_eq!(kube_error.and_then(KubeError::status_code), Some(500));
        let api_error = kube_error
            .and_then(|k| k.source())
            .and_then(|s| s.downcast_ref::<kube::Error>());
        assert!(
            matches!(api_error, Some(kube::Error::Api(s)) if s.reason == "Reason"),
            "{api_error:?}"
        );
        let timeout = BackendError::from(KubeError::Timeout("pod sb-1 not ready".into()));
        assert!(matches!(timeout, BackendError::Unavailable { .. }));
        assert!(timeout.source().is_some_and(|s| s.is::<KubeError>()));
    }
}

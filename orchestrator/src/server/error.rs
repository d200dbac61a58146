//! The one place a [`service::Error`](Error) becomes an HTTP answer. The `From` impl
//! below picks the [`ServiceErrorCode`] of each error; the status follows from
//! [`ServiceErrorCode::http_status`], and [`IntoResponse`] writes the body
//! `{"detail", "code"}` ([`Detail`]). The code and, for a 5xx, the internal detail ride
//! along in the response's extensions for the request log, never in the body.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use orchard_protocol::compat::Detail;
use orchard_protocol::ServiceErrorCode;

use crate::backend::BackendError;
use crate::service::Error;

/// The code of an error answer, for the logging middleware.
#[derive(Clone, Copy)]
pub(super) struct ErrorCodeExt(pub(super) ServiceErrorCode);

/// The internal detail of a 5xx, for the log only.
#[derive(Clone)]
pub(super) struct InternalDetail(pub(super) String);

/// `Retry-After` of every 503: seconds a client waits before trying again.
const RETRY_AFTER_S: &str = "2";

/// What the API answers for each service error.
impl From<&Error> for ServiceErrorCode {
    fn from(e: &Error) -> Self {
        use ServiceErrorCode as C;
        match e {
            Error::BadRequest(_)
            | Error::BadSandboxId(_)
            | Error::BadEnv(_)
            | Error::BadLabel(_)
            | Error::OverCapacity(_) => C::BadRequest,
            Error::Unauthorized(_) => C::Unauthorized,
            Error::Forbidden(_) => C::PermissionDenied,
            Error::NotFound(_) | Error::NoSandbox(_) | Error::NoJob(_) | Error::NoSnapshot(_) => {
                C::NotFound
            }
            Error::Timeout(_) | Error::ReadyTimeout { .. } => C::Timeout,
            Error::Conflict(_)
            | Error::SandboxExists(_)
            | Error::NotReady(_)
            | Error::Paused(_) => C::Conflict,
            Error::TooLarge(_) => C::BodyTooLarge,
            Error::Unprocessable(_) => C::Unprocessable,
            Error::Quota(_) | Error::QuotaExceeded(_) | Error::SnapshotStorage(_) => {
                C::QuotaExceeded
            }
            Error::Internal { .. } => C::Internal,
            Error::Sandbox(_)
            | Error::AgentUnreachable { .. }
            | Error::AgentFailed { .. }
            | Error::StartFailed { .. }
            | Error::SandboxFailed { .. } => C::SandboxFailed,
            Error::Unavailable(_) | Error::StoreUnavailable(_) => C::Unavailable,
            // By kind only: the message (often a cause's own words) never decides.
            Error::Backend(b) => match b {
                BackendError::NotFound(_) => C::NotFound,
                BackendError::Invalid { .. } => C::BadRequest,
                BackendError::Exists(_) | BackendError::Conflict { .. } => C::Conflict,
                BackendError::Unsupported(_) => C::NotImplemented,
                BackendError::Unavailable { .. } => C::Unavailable,
                BackendError::Failed { .. } => C::SandboxFailed,
            },
        }
    }
}

/// The HTTP status of `e`.
pub fn status(e: &Error) -> u16 {
    ServiceErrorCode::from(e).http_status()
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let code = ServiceErrorCode::from(&self);
        let body = Detail::new(code, self.public_message());
        let status =
            StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, axum::Json(body)).into_response();
        if code == ServiceErrorCode::Unavailable {
            // Orchard's SDK (and ours) wait this long before retrying a 503.
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_S));
        }
        resp.extensions_mut().insert(ErrorCodeExt(code));
        if let Error::Internal { detail, .. } = self {
            resp.extensions_mut().insert(InternalDetail(detail));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// Every generic variant with the status and code the API has always answered for it.
    #[test]
    fn every_generic_error_maps_to_its_status_and_code() {
        let s = || "x".to_string();
        let cases: Vec<(Error, u16, &str)> = vec![
            (Error::BadRequest(s()), 400, "bad_request"),
            (Error::Unprocessable(s()), 422, "unprocessable"),
            (Error::Unauthorized(s()), 401, "unauthorized"),
            (Error::Forbidden(s()), 403, "permission_denied"),
            (Error::NotFound(s()), 404, "not_found"),
            (Error::Timeout(s()), 408, "timeout"),
            (Error::Conflict(s()), 409, "conflict"),
            (Error::TooLarge(s()), 413, "body_too_large"),
            (Error::Quota(s()), 429, "quota_exceeded"),
            (Error::Sandbox(s()), 502, "sandbox_failed"),
            (Error::Unavailable(s()), 503, "unavailable"),
            (Error::internal("x", "y"), 500, "internal"),
            // The seams' errors with their cause, answered as the variant each was.
            (
                Error::AgentUnreachable {
                    reason: s(),
                    source: orchard_client::ClientError::decode(s()),
                },
                502,
                "sandbox_failed",
            ),
            (
                Error::AgentFailed {
                    message: s(),
                    source: orchard_client::ClientError::decode(s()),
                },
                502,
                "sandbox_failed",
            ),
            (
                Error::StoreUnavailable(crate::state::StoreError::unavailable(
                    s(),
                    std::io::Error::other(s()),
                )),
                503,
                "unavailable",
            ),
        ];
        for (e, want_status, want_code) in cases {
            assert_eq!(ServiceErrorCode::from(&e).as_str(), want_code, "{e:?}");
            assert_eq!(status(&e), want_status, "{e:?}");
        }
    }

    /// A backend's error keeps its kind to the edge and answers what it always did,
    /// whatever its message says: every kind is tried with the same words, which name
    /// another kind's status ("no sandbox", "already exists", "unavailable").
    #[test]
    fn backend_errors_map_by_kind() {
        let cause = || std::io::Error::other("no sandbox sb-1: already exists, unavailable");
        let m = || cause().to_string();
        let cases = [
            (BackendError::NotFound(m()), 404, "not_found"),
            (BackendError::invalid(m()), 400, "bad_request"),
            (BackendError::invalid_by(m(), cause()), 400, "bad_request"),
            (BackendError::Exists(m()), 409, "conflict"),
            (BackendError::unavailable(m()), 503, "unavailable"),
            (
                BackendError::unavailable_by(m(), cause()),
                503,
                "unavailable",
            ),
            (BackendError::failed(m()), 502, "sandbox_failed"),
            (BackendError::failed_by(m(), cause()), 502, "sandbox_failed"),
            (BackendError::conflict_by(m(), cause()), 409, "conflict"),
            (BackendError::Unsupported(m()), 501, "not_implemented"),
        ];
        for (b, want_status, want_code) in cases {
            let message = b.to_string();
            let e = Error::from(b);
            assert!(matches!(e, Error::Backend(_)), "{e:?}");
            assert_eq!(e.public_message(), message);
            assert_eq!(ServiceErrorCode::from(&e).as_str(), want_code, "{e:?}");
            assert_eq!(status(&e), want_status, "{e:?}");
        }
    }

    /// The store's errors answer by kind: away is a 503 in the store's words, anything
    /// else a 500 that tells the client only that a write was refused.
    #[test]
    fn store_errors_map_by_kind() {
        use crate::state::StoreError;
        let away = StoreError::unavailable(
            "redis: no answer within the call timeout",
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        );
        let message = away.to_string();
        let e = Error::from(away);
        assert_eq!((status(&e), e.public_message()), (503, message));
        // Whatever the key is called, only the kind decides.
        for refused in [
            StoreError::Conflict("unavailable".into()),
            StoreError::Exists("the state store failed".into()),
            StoreError::NotFound("sb-1".into()),
        ] {
            let e = Error::from(refused);
            assert_eq!(status(&e), 500, "{e:?}");
            assert_eq!(e.public_message(), "the state store refused a write");
        }
    }

    /// The agent's and the store's errors that keep their cause answer byte for byte what
    /// the message-only variants they were built as did: status, `Retry-After` and body.
    #[tokio::test]
    async fn errors_that_keep_their_cause_answer_what_they_always_did() {
        use orchard_client::ClientError;
        use orchard_protocol::{ErrorBody, ErrorCode};
        let transport = || {
            ClientError::transport(
                "connection refused",
                std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            )
        };
        let failed = || ClientError::Api {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: ErrorBody::new(ErrorCode::Internal, "disk on fire"),
        };
        let away = || {
            crate::state::StoreError::unavailable(
                "redis: no answer within the call timeout",
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            )
        };
        let cases = [
            (
                Error::from(transport()),
                Error::Sandbox(format!(
                    "the sandbox's agent could not be reached: {}",
                    transport()
                )),
            ),
            (
                crate::service::files::agent_unreachable(transport()),
                Error::Sandbox(
                    "the sandbox's agent could not be reached: connection refused".into(),
                ),
            ),
            (
                Error::from(ClientError::decode("a broken answer")),
                Error::Sandbox(
                    "the sandbox's agent could not be reached: decoding the answer: a broken answer"
                        .into(),
                ),
            ),
            (
                Error::from(failed()),
                Error::Sandbox("the sandbox's agent failed: disk on fire".into()),
            ),
            (
                Error::from(away()),
                Error::Unavailable(away().to_string()),
            ),
        ];
        for (new, old) in cases {
            let debug = format!("{new:?}");
            assert!(
                !matches!(new, Error::Sandbox(_) | Error::Unavailable(_)),
                "{debug}"
            );
            assert_eq!(answer(new).await, answer(old).await, "{debug}");
        }
    }

    /// What the client reads of a backend failure is its message, as before; the cause
    /// under it stays reachable through the service's error, for the log.
    #[tokio::test]
    async fn a_backend_failure_answers_its_message_and_keeps_its_cause() {
        use std::error::Error as _;
        let io = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let message = format!("backend root /var/lib/orchard: {io}");
        let e = Error::from(BackendError::failed_by(message.clone(), io));
        let cause = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            cause.map(std::io::Error::kind),
            Some(std::io::ErrorKind::PermissionDenied)
        );
        let (status, _, body) = answer(e).await;
        assert_eq!(status, 502);
        assert_eq!(
            body,
            serde_json::json!({"detail": message, "code": "sandbox_failed"})
        );
    }

    /// Every domain variant answers what the generic variant it stands for answered
    /// (`NotReady` was a `Conflict`, `QuotaExceeded` a `Quota`, ...).
    #[test]
    fn every_domain_error_maps_to_the_status_and_code_it_always_had() {
        let pinned: &[(&str, u16, &str)] = &[
            ("NoSandbox", 404, "not_found"),
            ("NoJob", 404, "not_found"),
            ("SandboxExists", 409, "conflict"),
            ("BadSandboxId", 400, "bad_request"),
            ("NotReady", 409, "conflict"),
            ("Paused", 409, "conflict"),
            ("NoSnapshot", 404, "not_found"),
            ("ReadyTimeout", 408, "timeout"),
            ("StartFailed", 502, "sandbox_failed"),
            ("SandboxFailed", 502, "sandbox_failed"),
            ("BadEnv", 400, "bad_request"),
            ("BadLabel", 400, "bad_request"),
            ("QuotaExceeded", 429, "quota_exceeded"),
            ("OverCapacity", 400, "bad_request"),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (e, _) in Error::domain_examples() {
            let debug = format!("{e:?}");
            let variant = debug.split(['(', ' ', '{']).next().unwrap_or_default();
            let Some((_, want_status, want_code)) = pinned.iter().find(|p| p.0 == variant) else {
                panic!("{variant} has no pinned status and code here");
            };
            assert_eq!(ServiceErrorCode::from(&e).as_str(), *want_code, "{e:?}");
            assert_eq!(status(&e), *want_status, "{e:?}");
            seen.insert(variant.to_string());
        }
        for (variant, _, _) in pinned {
            assert!(seen.contains(*variant), "no example of {variant}");
        }
    }

    async fn answer(e: Error) -> (u16, Option<String>, serde_json::Value) {
        let resp = e.into_response();
        let status = resp.status().as_u16();
        let retry = resp
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_string());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, retry, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn the_answer_is_detail_and_code_with_retry_after_on_503() {
        let (status, retry, body) = answer(Error::not_ready("sb-1")).await;
        assert_eq!(status, 409);
        assert_eq!(retry, None);
        assert_eq!(
            body,
            serde_json::json!({"detail": "sandbox sb-1 is not ready yet", "code": "conflict"})
        );
        let (status, retry, body) = answer(Error::Unavailable("the queue is full".into())).await;
        assert_eq!(status, 503);
        assert_eq!(retry.as_deref(), Some(RETRY_AFTER_S));
        assert_eq!(body["code"], "unavailable");
        let (status, _, body) = answer(Error::internal("listing failed", "EIO at /x")).await;
        assert_eq!(status, 500);
        assert_eq!(
            body,
            serde_json::json!({"detail": "listing failed", "code": "internal"})
        );
    }
}

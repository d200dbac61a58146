//! The service's error enum: what went wrong, in the service's terms. Domain facts have
//! variants of their own ([`Error::NoSandbox`], [`Error::NotReady`],
//! [`Error::QuotaExceeded`], [`Error::BadLabel`], ...); the rest are classes of input or
//! failure ([`Error::BadRequest`], [`Error::Internal`], ...). What the API answers for
//! each, its status and machine-readable code, is decided in one place, by the server
//! (`crate::server::error`), not here. Messages of internal failures are logged, never
//! sent: a 5xx body says what failed in user terms only.
//!
//! The errors of the seams below (backend, store, agent client) become the service's
//! here, each by its kind (its variant, or the agent's status), never by its words;
//! those that fail the call ([`Error::Backend`], [`Error::StoreUnavailable`],
//! [`Error::AgentUnreachable`], [`Error::AgentFailed`]) keep the seam's error whole as
//! their `#[source]`, for the log, with the message the API always sent.

use std::time::Duration;

use crate::backend::BackendError;
use crate::state::StoreError;

/// What went wrong. The `Display` of each variant is the message the client gets
/// (but for [`Error::Internal`], whose `public` part only is sent).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input (malformed JSON, a bad value).
    #[error("{0}")]
    BadRequest(String),
    /// JSON of the wrong shape (missing field, wrong type).
    #[error("{0}")]
    Unprocessable(String),
    /// No or wrong API key.
    #[error("{0}")]
    Unauthorized(String),
    /// The sandbox's filesystem refused (a read-only path, a file the image user may
    /// not write), or the key may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// No such image, file or route (or not the caller's); a sandbox or job that does
    /// not exist is [`Error::NoSandbox`] or [`Error::NoJob`].
    #[error("{0}")]
    NotFound(String),
    /// A server-side wait ran out.
    #[error("{0}")]
    Timeout(String),
    /// The target is not in a state for this.
    #[error("{0}")]
    Conflict(String),
    /// The body is larger than the route allows.
    #[error("{0}")]
    TooLarge(String),
    /// A per-key quota, as a message; [`Error::QuotaExceeded`] says which.
    #[error("{0}")]
    Quota(String),
    /// The sandbox could not start, or its agent's answer was unusable; an agent error
    /// with a cause is [`Error::AgentUnreachable`] or [`Error::AgentFailed`].
    #[error("{0}")]
    Sandbox(String),
    /// The sandbox's agent could not be reached, or its answer could not be read:
    /// answered as [`Error::Sandbox`], which it was.
    #[error("the sandbox's agent could not be reached: {reason}")]
    AgentUnreachable {
        /// What the message says of the failure (the client's error in full, or only
        /// the transport's words, as each caller always said it).
        reason: String,
        /// The client's error, down to hyper's or the OS's.
        #[source]
        source: orchard_client::ClientError,
    },
    /// The agent answered an error status that has no kind of its own here (a 500 of
    /// the agent's): answered as [`Error::Sandbox`], which it was.
    #[error("the sandbox's agent failed: {message}")]
    AgentFailed {
        /// The agent's message.
        message: String,
        /// The agent's answer ([`orchard_client::ClientError::Api`]): its status and code.
        #[source]
        source: orchard_client::ClientError,
    },
    /// Overloaded: safe to retry.
    #[error("{0}")]
    Unavailable(String),
    /// The state store could not be reached or failed ([`StoreError::Unavailable`]):
    /// answered as [`Error::Unavailable`], which it was, in the store's own words.
    #[error("{0}")]
    StoreUnavailable(#[source] StoreError),
    /// A bug or a host failure: `public` is sent, `detail` only logged.
    #[error("{public}: {detail}")]
    Internal {
        /// What the client is told.
        public: String,
        /// What the log gets.
        detail: String,
    },
    /// No sandbox with this id, or not the caller's (which must look the same).
    #[error("sandbox {0} not found")]
    NoSandbox(String),
    /// No job with this id, or not the caller's.
    #[error("job {0} not found")]
    NoJob(String),
    /// A sandbox with this id exists already.
    #[error("sandbox {0} already exists")]
    SandboxExists(String),
    /// The sandbox id is not one a sandbox can have.
    #[error(
        "invalid sandbox id {0:?}: use 1-63 characters of a-z, 0-9, '-', '_', '.', starting with a letter or digit"
    )]
    BadSandboxId(String),
    /// The sandbox is paused: its agent cannot be used until it is resumed.
    #[error("sandbox {0} is paused; resume it first (POST /v1/sandboxes/{0}/resume)")]
    Paused(String),
    /// No snapshot with this id, or not the caller's.
    #[error("snapshot {0} not found")]
    NoSnapshot(String),
    /// The sandbox is still starting: its agent cannot be used yet.
    #[error("sandbox {0} is not ready yet")]
    NotReady(String),
    /// The sandbox was not ready within the wait.
    #[error("sandbox {id} was not ready within {} s", .waited.as_secs_f64())]
    ReadyTimeout {
        /// The sandbox.
        id: String,
        /// How long the wait was.
        waited: Duration,
    },
    /// The sandbox could not start.
    #[error("sandbox {id} failed to start: {reason}")]
    StartFailed {
        /// The sandbox.
        id: String,
        /// Why, as the backend said.
        reason: String,
    },
    /// The sandbox has failed (it is kept, in phase `failed`, until deleted).
    #[error("sandbox {id} failed: {reason}")]
    SandboxFailed {
        /// The sandbox.
        id: String,
        /// Why, as the backend said.
        reason: String,
    },
    /// An environment variable no sandbox can have.
    #[error(transparent)]
    BadEnv(#[from] BadEnv),
    /// A label no sandbox can have.
    #[error(transparent)]
    BadLabel(#[from] BadLabel),
    /// A quota of the caller's API key is used up.
    #[error(transparent)]
    QuotaExceeded(#[from] QuotaExceeded),
    /// The host's snapshot storage is used up (all keys together, or its disk).
    #[error(transparent)]
    SnapshotStorage(#[from] SnapshotStorage),
    /// A create asks for more than one sandbox can have on this backend.
    #[error(transparent)]
    OverCapacity(#[from] OverCapacity),
    /// A backend call failed.
    #[error(transparent)]
    Backend(BackendError),
}

/// An environment variable of a create that no sandbox can have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadEnv {
    /// An empty name, a name with `=` or NUL, or a value with NUL.
    #[error("env {0:?}: names must be non-empty, without '=' or NUL, and values without NUL")]
    Malformed(String),
    /// A name the orchestrator sets itself.
    #[error("env {0:?} is reserved")]
    Reserved(String),
    /// More bytes of names and values together than a process can be given.
    #[error("env: {bytes} bytes of names and values; at most {max}")]
    TooLarge {
        /// The bytes given.
        bytes: usize,
        /// The most accepted.
        max: usize,
    },
}

/// A label of a create that no sandbox can have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadLabel {
    /// A key that is empty, longer than `max` or has other characters than
    /// `A-Za-z0-9._-/`.
    #[error("label key {key:?}: use 1-{max} characters of A-Z, a-z, 0-9, '.', '_', '-', '/'")]
    Key {
        /// The key.
        key: String,
        /// The longest key, in characters.
        max: usize,
    },
    /// A value longer than `max` bytes.
    #[error("label {key:?}: the value is longer than {max} bytes")]
    ValueTooLong {
        /// The key.
        key: String,
        /// The longest value, in bytes.
        max: usize,
    },
    /// A key under a prefix the orchestrator keeps for its own labels.
    #[error("label {key:?}: keys starting with {prefix:?} are reserved")]
    Reserved {
        /// The key.
        key: String,
        /// The reserved prefix.
        prefix: &'static str,
    },
    /// More labels than one sandbox or snapshot may carry.
    #[error("{count} labels: at most {max}")]
    TooMany {
        /// The labels given.
        count: usize,
        /// The most accepted.
        max: usize,
    },
}

/// A per-key quota that a create would exceed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaExceeded {
    /// The key holds `limit` sandboxes (pending or running) already.
    #[error("this API key holds {held} sandboxes, its limit is {limit}; delete one first")]
    Sandboxes {
        /// Sandboxes the key holds.
        held: usize,
        /// Sandboxes it may hold.
        limit: usize,
    },
    /// The key's snapshots hold `used` bytes; a new one would pass `limit`.
    #[error("this API key's snapshots hold {used} bytes, its limit is {limit}; delete one first")]
    SnapshotBytes {
        /// Bytes its snapshots hold (with the new one, when it was taken).
        used: u64,
        /// Bytes they may hold.
        limit: u64,
    },
    /// The key made `limit` creates in the last minute.
    #[error("this API key may create {limit} sandboxes per minute; try again in a minute")]
    CreatesPerMinute {
        /// Creates it may make per minute.
        limit: usize,
    },
}

/// Snapshot storage on this host is used up: not a quota of the caller's key, but
/// the bound of all keys together (snapshot data lives on the data directory's file
/// system, outside every sandbox's disk) or the file system's free-space reserve. No
/// snapshot is kept until some are deleted or the disk has room again; answered like a
/// quota (429), with the message saying which bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotStorage {
    /// All keys' snapshots hold `used` bytes; with this one they would pass `limit`.
    #[error(
        "the server's snapshot storage is full: all keys' snapshots hold {used} bytes, its bound is {limit}; delete snapshots first"
    )]
    Full {
        /// Bytes all snapshots hold (with the new one, when it was taken).
        used: u64,
        /// Bytes they may hold together.
        limit: u64,
    },
    /// The data directory's file system has `free` bytes free, less than `reserve`.
    #[error(
        "the server's disk is nearly full: {free} bytes free, and snapshots leave at least {reserve}; delete snapshots first"
    )]
    LowSpace {
        /// Bytes free (after the snapshot, when it was taken).
        free: u64,
        /// Bytes snapshots leave free.
        reserve: u64,
    },
}

/// A limit of a create larger than any sandbox can have on this backend (its host's
/// CPUs or memory): no wait or retry helps, so it is the client's mistake (400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OverCapacity {
    /// More CPUs than the host has.
    #[error("cpu {asked}: a sandbox here can have at most {max} CPUs")]
    Cpus {
        /// CPUs asked for.
        asked: f64,
        /// The most a sandbox can have.
        max: f64,
    },
    /// More memory than the host has.
    #[error("memory of {asked} bytes: a sandbox here can have at most {max} bytes ({} MiB)", max >> 20)]
    Memory {
        /// Bytes asked for.
        asked: u64,
        /// The most a sandbox can have.
        max: u64,
    },
}

impl Error {
    /// What the client is told.
    pub fn public_message(&self) -> String {
        match self {
            Error::Internal { public, .. } => public.clone(),
            e => e.to_string(),
        }
    }

    /// An internal error: `public` for the client, `detail` for the log.
    pub fn internal(public: impl Into<String>, detail: impl std::fmt::Display) -> Error {
        Error::Internal {
            public: public.into(),
            detail: detail.to_string(),
        }
    }

    /// [`Error::NoSandbox`].
    pub(crate) fn no_sandbox(id: &str) -> Error {
        Error::NoSandbox(id.to_string())
    }

    /// [`Error::NoJob`].
    pub(crate) fn no_job(id: &str) -> Error {
        Error::NoJob(id.to_string())
    }

    /// [`Error::NotReady`].
    pub fn not_ready(id: &str) -> Error {
        Error::NotReady(id.to_string())
    }

    /// [`Error::SandboxFailed`].
    pub fn sandbox_failed(id: &str, reason: impl std::fmt::Display) -> Error {
        Error::SandboxFailed {
            id: id.to_string(),
            reason: reason.to_string(),
        }
    }

    /// [`Error::StartFailed`].
    pub fn start_failed(id: &str, reason: impl std::fmt::Display) -> Error {
        Error::StartFailed {
            id: id.to_string(),
            reason: reason.to_string(),
        }
    }

    /// [`Error::ReadyTimeout`].
    pub fn ready_timeout(id: &str, waited: Duration) -> Error {
        Error::ReadyTimeout {
            id: id.to_string(),
            waited,
        }
    }
}

/// A backend's error keeps its type up to the edge, where `server/error.rs` maps each
/// kind to its code; its message is the backend's own.
impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        Error::Backend(e)
    }
}

/// A CPU or memory quantity the client wrote wrong: a 400 in its own words.
impl From<crate::units::QuantityError> for Error {
    fn from(e: crate::units::QuantityError) -> Self {
        Error::BadRequest(e.to_string())
    }
}

/// The store failing is the service's failure (a 500/503), never the client's. By
/// kind: away is a 503 in the store's own words ("the state store failed: ...", which
/// quote the cause), kept whole as the source; anything else a 500. Callers that can
/// act on `Conflict` or `NotFound` (retry, "no such sandbox") match them before
/// converting.
impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            e @ StoreError::Unavailable { .. } => Error::StoreUnavailable(e),
            e => Error::internal("the state store refused a write", e),
        }
    }
}

/// The agent answered an error or could not be reached: by kind, the status the agent
/// answered, or no usable answer at all. A status with a kind of its own here takes the
/// agent's message; the rest keep the client's error as their source.
impl From<orchard_client::ClientError> for Error {
    fn from(e: orchard_client::ClientError) -> Self {
        match e {
            orchard_client::ClientError::Api { status, body } => match status.as_u16() {
                404 => Error::NotFound(body.message),
                400 | 422 => Error::BadRequest(body.message),
                // Regression: a write to a read-only path was a 502.
                403 => Error::Forbidden(body.message),
                408 => Error::Timeout(body.message),
                409 => Error::Conflict(body.message),
                413 => Error::TooLarge(body.message),
                429 | 503 => Error::Unavailable(body.message),
                _ => Error::AgentFailed {
                    message: body.message.clone(),
                    source: orchard_client::ClientError::Api { status, body },
                },
            },
            e => Error::AgentUnreachable {
                reason: e.to_string(),
                source: e,
            },
        }
    }
}

/// No random bytes is the host's failure (a 500), never the client's.
impl From<crate::random::RandomError> for Error {
    fn from(e: crate::random::RandomError) -> Self {
        Error::internal("cannot make a random id", e)
    }
}

#[cfg(test)]
impl Error {
    /// One error of each domain variant with the message it sends, for the tests here
    /// and the server's.
    pub(crate) fn domain_examples() -> Vec<(Error, &'static str)> {
        vec![
            (Error::no_sandbox("sb-1"), "sandbox sb-1 not found"),
            (Error::no_job("j-1"), "job j-1 not found"),
            (
                Error::SandboxExists("sb-1".into()),
                "sandbox sb-1 already exists",
            ),
            (
                Error::BadSandboxId("-x".into()),
                "invalid sandbox id \"-x\": use 1-63 characters of a-z, 0-9, '-', '_', '.', \
                     starting with a letter or digit",
            ),
            (Error::not_ready("sb-1"), "sandbox sb-1 is not ready yet"),
            (
                Error::Paused("sb-1".into()),
                "sandbox sb-1 is paused; resume it first (POST /v1/sandboxes/sb-1/resume)",
            ),
            (Error::NoSnapshot("snap-1".into()), "snapshot snap-1 not found"),
            (
                QuotaExceeded::SnapshotBytes { used: 10, limit: 5 }.into(),
                "this API key's snapshots hold 10 bytes, its limit is 5; delete one first",
            ),
            (
                Error::ready_timeout("sb-1", Duration::from_millis(2500)),
                "sandbox sb-1 was not ready within 2.5 s",
            ),
            (
                Error::ready_timeout("sb-1", Duration::from_secs(30)),
                "sandbox sb-1 was not ready within 30 s",
            ),
            (
                Error::start_failed("sb-1", "no such image"),
                "sandbox sb-1 failed to start: no such image",
            ),
            (
                Error::sandbox_failed("sb-1", "out of memory"),
                "sandbox sb-1 failed: out of memory",
            ),
            (
                BadEnv::Malformed("A=B".into()).into(),
                r#"env "A=B": names must be non-empty, without '=' or NUL, and values without NUL"#,
            ),
            (
                BadEnv::Reserved("ORCHARD_AGENT_TOKEN".into()).into(),
                r#"env "ORCHARD_AGENT_TOKEN" is reserved"#,
            ),
            (
                BadLabel::Key {
                    key: "a b".into(),
                    max: 128,
                }
                .into(),
                r#"label key "a b": use 1-128 characters of A-Z, a-z, 0-9, '.', '_', '-', '/'"#,
            ),
            (
                BadLabel::ValueTooLong {
                    key: "k".into(),
                    max: 1024,
                }
                .into(),
                r#"label "k": the value is longer than 1024 bytes"#,
            ),
            (
                BadLabel::Reserved {
                    key: "orchard.x".into(),
                    prefix: "orchard.",
                }
                .into(),
                r#"label "orchard.x": keys starting with "orchard." are reserved"#,
            ),
            (
                QuotaExceeded::Sandboxes { held: 3, limit: 3 }.into(),
                "this API key holds 3 sandboxes, its limit is 3; delete one first",
            ),
            (
                QuotaExceeded::CreatesPerMinute { limit: 10 }.into(),
                "this API key may create 10 sandboxes per minute; try again in a minute",
            ),
            (
                OverCapacity::Cpus {
                    asked: 3.5,
                    max: 2.0,
                }
                .into(),
                "cpu 3.5: a sandbox here can have at most 2 CPUs",
            ),
            (
                OverCapacity::Memory {
                    asked: 1 << 40,
                    max: 24 << 30,
                }
                .into(),
                "memory of 1099511627776 bytes: a sandbox here can have at most 25769803776 bytes (24576 MiB)",
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The domain variants say exactly what the generic ones they stand for said, in
    /// the same words as the service's checks wrote them.
    #[test]
    fn domain_variants_keep_the_messages_the_api_always_sent() {
        for (e, message) in Error::domain_examples() {
            assert_eq!(e.public_message(), message, "{e:?}");
        }
    }

    /// An agent nobody could reach: the message is what it always was, and the client's
    /// error stays under it, down to the OS's.
    #[test]
    fn an_unreachable_agent_keeps_the_client_error_as_the_source() {
        use std::error::Error as _;
        let refused = || {
            orchard_client::ClientError::transport(
                "connection refused",
                std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            )
        };
        let e = Error::from(refused());
        assert!(matches!(e, Error::AgentUnreachable { .. }), "{e:?}");
        assert_eq!(
            e.public_message(),
            format!("the sandbox's agent could not be reached: {}", refused())
        );
        let client = e
            .source()
            .and_then(|s| s.downcast_ref::<orchard_client::ClientError>());
        assert!(
            matches!(client, Some(orchard_client::ClientError::Transport { .. })),
            "{e:?}"
        );
        let io = client
            .and_then(|c| c.source())
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
        // The files' calls say the transport's words alone, as they always did.
        let e = super::super::files::agent_unreachable(refused());
        assert_eq!(
            e.public_message(),
            "the sandbox's agent could not be reached: connection refused"
        );
        assert!(e
            .source()
            .is_some_and(|s| s.is::<orchard_client::ClientError>()));
        // An answer that could not be read is no answer either.
        let e = Error::from(orchard_client::ClientError::decode("a broken answer"));
        assert_eq!(
            e.public_message(),
            "the sandbox's agent could not be reached: decoding the answer: a broken answer"
        );
        assert!(e
            .source()
            .is_some_and(|s| s.is::<orchard_client::ClientError>()));
    }

    /// An agent's status with no kind of its own here: its message, as always, and its
    /// whole answer (status and code) as the source.
    #[test]
    fn an_agent_failure_keeps_the_agent_answer_as_the_source() {
        use orchard_protocol::{ErrorBody, ErrorCode};
        use std::error::Error as _;
        let e = Error::from(orchard_client::ClientError::Api {
            status: hyper::StatusCode::INTERNAL_SERVER_ERROR,
            body: ErrorBody::new(ErrorCode::Internal, "disk on fire"),
        });
        assert!(matches!(e, Error::AgentFailed { .. }), "{e:?}");
        assert_eq!(
            e.public_message(),
            "the sandbox's agent failed: disk on fire"
        );
        let answer = e
            .source()
            .and_then(|s| s.downcast_ref::<orchard_client::ClientError>());
        assert!(
            matches!(
                answer,
                Some(orchard_client::ClientError::Api { status, .. }) if status.as_u16() == 500
            ),
            "{e:?}"
        );
        assert_eq!(
            answer.and_then(orchard_client::ClientError::code),
            Some(ErrorCode::Internal)
        );
    }

    /// A store that is away: its own words, as always, and itself as the source.
    #[test]
    fn an_unavailable_store_keeps_the_store_error_as_the_source() {
        use std::error::Error as _;
        let away = || {
            StoreError::unavailable(
                "redis: no answer within the call timeout",
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            )
        };
        let e = Error::from(away());
        assert!(matches!(e, Error::StoreUnavailable(_)), "{e:?}");
        assert_eq!(e.public_message(), away().to_string());
        let store = e.source().and_then(|s| s.downcast_ref::<StoreError>());
        assert!(
            matches!(store, Some(StoreError::Unavailable { .. })),
            "{e:?}"
        );
        let io = store
            .and_then(|s| s.source())
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::TimedOut)
        );
    }

    #[test]
    fn an_internal_error_tells_the_client_only_its_public_part() {
        let e = Error::internal("cannot open the job store", "EACCES on /var/lib/x");
        assert_eq!(e.public_message(), "cannot open the job store");
        assert_eq!(
            e.to_string(),
            "cannot open the job store: EACCES on /var/lib/x"
        );
    }
}

//! What went wrong in a store: [`StoreError`], by the kind callers decide on. A leaf of
//! [`crate::state`].

/// What went wrong in the store. The variant is the kind callers decide on (retry a
/// `Conflict`, give up on `NotFound`, wait out `Unavailable`); the first three are data
/// (the key), `Unavailable` carries what failed as its cause.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An insert found the key taken.
    #[error("{0} already exists")]
    Exists(String),
    /// A compare-and-set found another version, or a fenced write a newer lease.
    #[error("{0} changed meanwhile")]
    Conflict(String),
    /// The record is gone.
    #[error("{0} not found")]
    NotFound(String),
    /// The store could not be reached or failed (I/O, a lost connection).
    #[error("the state store failed: {message}")]
    Unavailable {
        /// What failed (it may quote the cause, as the log and a 503 say it).
        message: String,
        /// The cause: Redis' error, a timeout, the journal's `io::Error`, a record
        /// that does not parse.
        #[source]
        source: crate::backend::BoxError,
    },
}

impl StoreError {
    /// [`StoreError::Unavailable`] saying `message`, caused by `source`.
    pub fn unavailable(
        message: impl Into<String>,
        source: impl Into<crate::backend::BoxError>,
    ) -> Self {
        StoreError::Unavailable {
            message: message.into(),
            source: source.into(),
        }
    }
}

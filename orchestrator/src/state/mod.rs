//! Where the orchestrator's shared state lives: the [`StateStore`] trait, the records it
//! holds, and its implementations: [`memory::MemoryStore`] (one process, the default)
//! and [`redis::RedisStore`] (many replicas over one Redis). [`conformance`] holds the
//! checks both pass.
//!
//! Everything a second server replica would need to see is here, as data: sandbox
//! records ([`SandboxRecord`], with the phase and the agent's endpoint and token), jobs
//! ([`JobRecord`]) and their order per sandbox, quota counters, per-sandbox leases with
//! fencing tokens, and change notifications. What only makes sense in one process (the
//! pooled agent connections, the job worker tasks, the create tasks) is the service's
//! runtime and is never stored.
//!
//! The meaning of each operation, which any implementation must
//! keep across processes:
//! - **Versions.** Every write of a sandbox record gives it a new [`Version`];
//!   [`StateStore::update_sandbox`] is a compare-and-set on it, so two writers never
//!   lose each other's change: the loser gets [`StoreError::Conflict`], re-reads and
//!   retries (the service's `update` helper does that).
//! - **Job order.** Jobs of one sandbox are taken ([`StateStore::take_job`]) in the
//!   order they were inserted, each exactly once.
//! - **Leases.** [`StateStore::acquire_lease`] gives a named lease to one holder until it
//!   expires or is released; each grant carries a fencing token larger than every
//!   earlier grant's, and the job writes that take a lease ([`StateStore::take_job`],
//!   [`StateStore::finish_job`]) are refused once a newer grant exists, so a holder that
//!   paused past its expiry cannot overwrite its successor's work.
//! - **Counters.** [`StateStore::acquire_slot`] increments a counter only while it is
//!   below a limit, atomically; [`StateStore::hit_rate`] admits at most `limit` hits per
//!   sliding window.
//! - **Notifications.** [`StateStore::subscribe`] returns a [`Subscription`] that wakes
//!   after every write to its topic made after the subscription: subscribe, read, then
//!   wait, and no change is missed. Waits never poll.
//!
//! Parts, imported one way: [`record`] (the records, as data), [`error`]
//! ([`StoreError`]), [`store`] (the trait), then the stores over them; this module
//! only gathers them (every path above stays `crate::state::X`).

#[doc(hidden)]
pub mod conformance;
pub mod error;
pub mod memory;
pub mod record;
#[cfg(feature = "redis")]
pub mod redis;
mod spill;
pub mod store;

pub use crate::backend::AgentEndpoint;
pub use error::StoreError;
pub use record::{
    AgentRecord, JobOptions, JobRecord, JobView, Lease, OutputFile, Phase, SandboxRecord, Topic,
    Version, Versioned, DROPPED_NOTE,
};
pub use spill::read_file as read_output;
pub use store::{until_answered, StateStore, StoreFuture, Subscription};

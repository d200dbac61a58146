//! HTTP glue: the router, the state it serves, and running the agent.
//!
//! [`router()`] merges every capability's routes behind the gate (token, shutdown) and
//! drains what a handler left unread; [`state`] composes [`AppState`] from the
//! capabilities' own states; [`run()`] binds the listeners, does PID 1's start-up and
//! shuts down on a signal. Only this module knows every capability.

pub mod router;
pub mod run;
pub mod state;
#[cfg(test)]
pub(crate) mod test_http;

pub use self::router::router;
pub use self::run::run;
pub use self::state::AppState;

//! HTTP glue: the router, the state it serves, and running the agent.

pub mod router;
pub mod run;
pub mod state;
#[cfg(test)]
pub(crate) mod test_http;

pub use self::router::router;
pub use self::run::run;
pub use self::state::AppState;

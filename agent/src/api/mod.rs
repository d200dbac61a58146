//! The API capabilities: one module per thing a client can ask of the sandbox.
//!
//! Each capability defines its own state (the part of [`crate::server::AppState`] its
//! handlers receive, through axum's `FromRef`: [`exec::Execs`], [`process::Processes`],
//! [`session::Sessions`], [`pty::Terminals`], [`files::Files`],
//! [`health::HealthState`], [`token::Token`]; git needs none) and a generic
//! `routes<S>()` that names only the substates it needs, so no capability knows the
//! server's state or another capability's tables. Handlers parse, call and shape;
//! the process machinery is [`crate::proc`]'s.
//!
//! [`extract`] and [`registry`] are what the capabilities share: the request
//! extractors with the API's own error body, and the tables of things by id.

pub mod exec;
pub mod extract;
pub mod files;
pub mod git;
pub mod health;
pub mod kept;
pub mod process;
pub mod pty;
pub mod registry;
pub mod session;
pub mod token;

//! The API capabilities: one module per thing a client can ask of the sandbox.

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

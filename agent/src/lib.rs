//! `orchard-agent`: the program that runs as PID 1 inside every sandbox.
//!
//! It needs nothing from the image (it is a static musl binary) and serves the sandbox's
//! capabilities over HTTP on a Unix socket and/or TCP, behind the sandbox token.
//!
//! - [`server`] wires the HTTP routes and token auth over [`state::AppState`], the state
//!   every handler shares; [`extract`] holds the JSON and query extractors and the body
//!   limits the capabilities share.
//! - [`init`] splits a PID 1 agent into a tiny dumpable init (the image's environment
//!   in `/proc/1/environ`, orphans reaped, signals forwarded) and the protected agent.
//! - [`spawn`] starts every command in its own session; [`reaper`] is the only place
//!   that waits on children, so PID 1's orphan reaping never steals a status.
//! - [`supervise`] watches a command to its end (output pumps, timeout, kill, drain),
//!   shared by [`exec`] (sync and streamed) and [`process`] (background processes);
//!   [`session`] keeps persistent shells; [`pty`] runs terminals over WebSocket.
//! - [`git`] reads and changes repositories through libgit2.
//! - [`files`] and [`archive`] read and write the sandbox's filesystem; [`health`]
//!   reports usage. [`buffer`] holds the bounded output buffers.
//! - [`procfs`] parses `/proc`; [`registry`] keeps processes, sessions and
//!   terminals by id; [`sys`] holds the safe system-call helpers several modules share
//!   (`openpty`, signal numbers, random ids).
//! - [`config`] holds the limits and their defaults; [`error`] maps every failure to
//!   one wire error.

pub mod archive;
pub mod buffer;
pub mod chunks;
pub mod config;
pub mod error;
pub mod exec;
pub mod extract;
pub mod files;
pub mod fsuser;
pub mod git;
pub mod health;
pub mod init;
pub mod kept;
pub mod placement;
pub mod process;
pub mod procfs;
pub mod pty;
pub mod reaper;
pub mod registry;
pub mod run;
pub mod server;
pub mod session;
pub mod spawn;
pub mod state;
pub mod supervise;
pub mod sys;
pub mod token;
pub mod tools;

#[cfg(test)]
mod test_http;

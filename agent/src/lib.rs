//! `orchard-agent`: the program that runs as PID 1 inside every sandbox.
//!
//! It needs nothing from the image (it is a static musl binary) and serves the sandbox's
//! capabilities over HTTP on a Unix socket and/or TCP, behind the sandbox token.
//!
//! The crate is grouped by what each part is, and imports run one way, down this list
//! (a check in `make lint`, `scripts/import-cycles.py`, fails on any circle):
//!
//! - [`server`], the HTTP glue: [`server::router()`] merges the capabilities' routes
//!   behind the gate (token, shutdown) and drains unread bodies; [`server::state`]
//!   composes [`server::AppState`] from each capability's own state and hands each
//!   handler only its part (axum's `FromRef`); [`server::run()`] binds the listeners,
//!   does PID 1's start-up and shuts down cleanly on SIGTERM or SIGINT.
//! - [`api`], the capabilities a client calls, one module each, each with its own
//!   routes and state: [`api::exec`] (sync and streamed, with [`api::kept`] results),
//!   [`api::process`] (background processes), [`api::session`] (persistent shells),
//!   [`api::pty`] (terminals over WebSocket), [`api::files`] (with tar in
//!   [`api::files::archive`]), [`api::git`] (libgit2), [`api::health`] and
//!   [`api::token`]; and what they share: [`api::extract`] (JSON and query extractors,
//!   body limits) and [`api::registry`] (tables of things by id).
//! - [`proc`], the process machinery under them: [`proc::spawn`] starts every command
//!   in its own process group, [`proc::reaper`] is the only place that waits on
//!   children (so PID 1's orphan reaping never steals a status), [`proc::supervise`]
//!   watches a command to its end (output pumps, timeout, kill, drain) into the
//!   bounded buffers of [`proc::buffer`] through the read buffers of [`proc::chunks`];
//!   [`proc::placement`] starts a command on its spawner's CPU when all are busy, and
//!   [`proc::procfs`] reads `/proc`.
//! - [`pid1`], PID 1's duties: [`pid1::init`] splits the agent into a tiny dumpable
//!   init (the image's environment in `/proc/1/environ`, orphans reaped, signals
//!   forwarded) and the protected agent; [`pid1::tools`] publishes the harness tools;
//!   [`pid1::user`] is the image's user, whom commands run as and whose file-system
//!   identity file access takes ([`pid1::fsuser`]).
//! - Leaves every group uses: [`config`] (the limits and their defaults), [`error`]
//!   (every failure mapped to one wire error) and [`sys`] (safe system-call helpers:
//!   `openpty`, signal numbers, random ids, temporary-name suffixes).
//!
//! Inside a directory the same holds: a `mod.rs` declares, re-exports and routes, and
//! what its children share sits in a sibling (`files/common.rs`, `git/repo.rs`,
//! `session/shell.rs`, `archive/error.rs`), never in the parent.

pub mod api;
pub mod config;
pub mod error;
pub mod pid1;
pub mod proc;
pub mod server;
pub mod sys;

//! `orchard-agent`: the program that runs as PID 1 inside every sandbox.
//!
//! It needs nothing from the image (it is a static musl binary) and serves the sandbox's
//! capabilities over HTTP on a Unix socket and/or TCP, behind the sandbox token.
//!
//! The crate is grouped by what each part is:
//!
//! - [`api`]: the capabilities a client calls, one module each ([`api::exec`],
//!   [`api::process`], [`api::session`], [`api::pty`], [`api::files`], [`api::git`],
//!   [`api::health`], [`api::token`]), with what they share: the extractors and body
//!   limits ([`api::extract`]) and the tables of things by id ([`api::registry`]).
//! - [`proc`]: the process machinery under them: [`proc::spawn`] starts every command
//!   in its own process group, [`proc::reaper`] is the only place that waits on
//!   children, [`proc::supervise`] watches a command to its end, with the bounded
//!   buffers ([`proc::buffer`], [`proc::chunks`]), CPU placement ([`proc::placement`])
//!   and `/proc` parsing ([`proc::procfs`]).
//! - [`pid1`]: PID 1's duties: the init split ([`pid1::init`]), publishing the harness
//!   tools ([`pid1::tools`]), file access as the image's user ([`pid1::fsuser`]).
//! - [`server`]: the HTTP glue: the router and token auth, the state the handlers
//!   share, the listeners and shutdown ([`server::run`]).
//! - [`config`] holds the limits and their defaults; [`error`] maps every failure to
//!   one wire error; [`sys`] holds the safe system-call helpers several modules share
//!   (`openpty`, signal numbers, random ids).

pub mod api;
pub mod config;
pub mod error;
pub mod pid1;
pub mod proc;
pub mod server;
pub mod sys;

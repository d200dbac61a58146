//! The state the router serves: one part per capability, each handed to its handlers
//! alone through axum's `FromRef` (as E2B's envd registers each service with only its
//! own dependencies). A capability names its own state type and nothing of this one,
//! so imports run one way: this module knows the capabilities, they do not know it.
//!
//! Parts that several capabilities share are shared by `Arc`, never copied: the exec
//! slots ([`Commands`], held by exec, processes and health), the reaper, the table of
//! background processes (processes and health) and the token (its route and the gate).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::FromRef;

use crate::api::exec::{Commands, Execs};
use crate::api::extract::BodyLimit;
use crate::api::files::Files;
use crate::api::health::HealthState;
use crate::api::process::Processes;
use crate::api::pty::Terminals;
use crate::api::session::Sessions;
use crate::api::token::Token;
use crate::config::Config;
use crate::proc::reaper::Reaper;

/// What every request passes before its handler: the token check, and the refusal of
/// new work once shutdown began.
#[derive(Clone)]
pub struct Gate {
    /// The token requests must carry (replaceable: `PUT /v1/token`).
    pub token: Token,
    /// Set once shutdown began; new work is refused.
    pub shutting_down: Arc<AtomicBool>,
}

/// The router's state: each capability's part, and the gate.
#[derive(Clone)]
pub struct AppState {
    /// Token and shutdown, checked on every request.
    pub gate: Gate,
    /// Largest JSON request body (every capability's [`crate::api::extract::JsonBody`]).
    pub body_limit: BodyLimit,
    /// `/v1/exec`.
    pub execs: Execs,
    /// `/v1/processes`.
    pub processes: Processes,
    /// `/v1/sessions`.
    pub sessions: Sessions,
    /// `/v1/pty`.
    pub terminals: Terminals,
    /// `/v1/files`.
    pub files: Files,
    /// `/v1/health`.
    pub health: HealthState,
}

impl AppState {
    /// State for `config`, reaping through `reaper`.
    pub fn new(config: Config, reaper: Arc<Reaper>) -> Self {
        let commands = Commands::new(&config, reaper.clone());
        let processes = Processes::new(&config, commands.clone());
        Self {
            gate: Gate {
                token: Token::new(&config.token),
                shutting_down: Arc::default(),
            },
            body_limit: BodyLimit(config.limits.max_body_bytes),
            execs: Execs::new(&config, commands.clone()),
            health: HealthState {
                started: Instant::now(),
                commands,
                processes: processes.table.clone(),
            },
            processes,
            sessions: Sessions::new(config.limits.clone(), reaper.clone()),
            terminals: Terminals::new(reaper),
            files: Files {
                max_upload_bytes: config.limits.max_upload_bytes,
            },
        }
    }

    /// Refuses new work from now on (see [`Gate`]).
    pub fn begin_shutdown(&self) {
        self.gate.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Forgets background processes past their retention and closes idle terminals;
    /// called periodically.
    pub fn sweep(&self) {
        self.processes.table.prune();
        self.terminals.table.sweep();
    }
}

/// The router serves `Arc<AppState>`, which axum clones for every request: one
/// reference count, as before the state was split into parts (the parts themselves
/// hold several). Each part goes to the handlers that ask for it.
pub type Shared = Arc<AppState>;

/// Each part to the handlers that ask for it.
macro_rules! parts {
    ($($part:ident: $ty:ty),* $(,)?) => {
        $(
            impl FromRef<Shared> for $ty {
                fn from_ref(state: &Shared) -> $ty {
                    state.$part.clone()
                }
            }
        )*
    };
}

parts! {
    gate: Gate,
    body_limit: BodyLimit,
    execs: Execs,
    processes: Processes,
    sessions: Sessions,
    terminals: Terminals,
    files: Files,
    health: HealthState,
}

impl FromRef<Shared> for Token {
    fn from_ref(state: &Shared) -> Token {
        state.gate.token.clone()
    }
}

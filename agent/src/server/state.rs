//! The state every handler shares: configuration, the reaper, the exec slots, and the
//! tables of background processes, sessions and terminals. Its own module so that the
//! capability modules can name it without depending on the router (`server`).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;

use crate::api::process::ProcessTable;
use crate::api::pty::PtyTable;
use crate::api::session::SessionTable;
use crate::config::Config;
use crate::proc::reaper::Reaper;

/// State shared by every handler.
pub struct AppState {
    /// Configuration and limits.
    pub config: Config,
    /// When the agent started.
    pub started: Instant,
    /// The one owner of `waitpid`.
    pub reaper: Arc<Reaper>,
    /// One permit per running command (sync, streamed or background).
    pub exec_slots: Arc<Semaphore>,
    /// Background processes.
    pub processes: ProcessTable,
    /// Execs run with a `result_id`.
    pub kept: crate::api::kept::KeptTable,
    /// Persistent shell sessions.
    pub sessions: SessionTable,
    /// Terminals.
    pub ptys: PtyTable,
    /// Set once shutdown began; new work is refused.
    pub shutting_down: AtomicBool,
    /// The token requests must carry (replaceable: `PUT /v1/token`).
    pub token: crate::api::token::Token,
}

impl AppState {
    /// State for `config`, reaping through `reaper`.
    pub fn new(config: Config, reaper: Arc<Reaper>) -> Arc<Self> {
        let slots = config.limits.max_concurrent_execs as usize;
        Arc::new(Self {
            processes: ProcessTable::new(&config),
            kept: Default::default(),
            sessions: SessionTable::default(),
            ptys: PtyTable::default(),
            token: crate::api::token::Token::new(&config.token),
            config,
            started: Instant::now(),
            reaper,
            exec_slots: Arc::new(Semaphore::new(slots)),
            shutting_down: AtomicBool::new(false),
        })
    }
}

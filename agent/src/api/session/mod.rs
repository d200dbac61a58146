//! Persistent shell sessions: `/v1/sessions`.
//!
//! Each session is one long-lived shell (bash when the image has it, else sh) fed
//! through a stdin pipe, so `cd`, `export` and functions persist. A command is sent as
//!
//! ```sh
//! __orchard_c='<command, single-quoted>'
//! command eval "$__orchard_c" </dev/null
//! printf '\n<nonce>%d\n' "$?"; printf '\n<nonce>\n' >&2
//! ```
//!
//! and is complete when the random per-command nonce shows up on both streams: no
//! sleeps, no prompt scraping. Quoting makes a syntax error in the command an error of
//! `eval` (reported through `$?`) rather than a shell left waiting for more input, and
//! `</dev/null` keeps a command that reads stdin from eating the commands after it.
//!
//! A timeout sends SIGINT to the shell's descendants (not the shell: without job
//! control they share its process group), then SIGKILL; only a command that is a shell
//! builtin loop makes the agent kill the shell, and the result then says the session
//! ended.
//!
//! `shell` holds the sessions themselves (the table, starting a shell, running a
//! command in it); `state` captures and restores one; this module holds the routes.

mod shell;
mod state;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRef, Path, State};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use orchard_protocol::session::{
    SessionCreate, SessionInfo, SessionList, SessionRun, SessionRunResult,
};
use orchard_protocol::ErrorCode;
use tokio::sync::Notify;

use self::shell::{kill_shell, run_in_shell, start_shell, CancelOnDrop};
pub use self::shell::{SessionTable, Sessions};
use crate::api::extract::{BodyLimit, JsonBody};
use crate::error::{ApiError, ApiResult};

/// Most sessions alive at once.
pub const MAX_SESSIONS: usize = 64;

/// Routes of the sessions capability.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Sessions: FromRef<S>,
    BodyLimit: FromRef<S>,
{
    Router::new()
        .route("/v1/sessions", post(create).get(list))
        .route("/v1/sessions/{id}", delete(remove).get(one))
        .route("/v1/sessions/{id}/run", post(run))
        .route("/v1/sessions/{id}/state", get(state::capture))
}

fn default_shell() -> &'static str {
    if std::path::Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

async fn create(
    State(sessions): State<Sessions>,
    JsonBody(req): JsonBody<SessionCreate>,
) -> ApiResult<Json<SessionInfo>> {
    if sessions.table.0.len() >= MAX_SESSIONS {
        return Err(ApiError::new(
            ErrorCode::TooManyProcesses,
            format!("{MAX_SESSIONS} sessions are open; delete one first"),
        ));
    }
    if let Some(restored) = req.restore {
        if req.shell.is_some() || req.cwd.is_some() || !req.env.is_empty() {
            return Err(ApiError::invalid(
                "restore brings back the session's own shell, cwd and env: give none of them with it",
            ));
        }
        return state::restore(&sessions, restored).await.map(Json);
    }
    let shell = req.shell.unwrap_or_else(|| default_shell().to_string());
    let started = start_shell(&sessions.reaper, shell, req.cwd, req.env, false)?;
    let session = sessions
        .table
        .0
        .insert_with(None, |id| started.into_session(id))?;
    Ok(Json(session.info()))
}

async fn list(State(sessions): State<Sessions>) -> Json<SessionList> {
    let sessions = sessions.table.0.values().iter().map(|s| s.info()).collect();
    Json(SessionList { sessions })
}

async fn one(
    State(sessions): State<Sessions>,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionInfo>> {
    Ok(Json(sessions.table.0.get(&id)?.info()))
}

async fn remove(
    State(sessions): State<Sessions>,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionInfo>> {
    let session = sessions.table.0.get(&id)?;
    kill_shell(session.pid);
    session.alive.store(false, Ordering::Relaxed);
    sessions.table.0.remove(&id);
    Ok(Json(session.info()))
}

async fn run(
    State(sessions): State<Sessions>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SessionRun>,
) -> ApiResult<Json<SessionRunResult>> {
    let session = sessions.table.0.get(&id)?;
    let timeout_ms = req.timeout_ms.unwrap_or(sessions.limits.default_timeout_ms);
    if timeout_ms == 0 {
        return Err(ApiError::invalid("timeout_ms must be at least 1"));
    }
    let cap = sessions.limits.max_output_bytes as usize;
    // The command runs in its own task: a client that gives up must not leave it
    // half-read in the shell, where its output and marker would leak into the next
    // run. Dropping the request interrupts the command instead, and the task reads up
    // to its marker before the session is free again.
    let cancel = Arc::new(Notify::new());
    let _cancel_on_drop = CancelOnDrop(cancel.clone());
    let task = tokio::spawn(run_in_shell(
        session,
        req.command,
        Duration::from_millis(timeout_ms),
        cap,
        cancel,
    ));
    match task.await {
        Ok(result) => result.map(Json),
        Err(_) => Err(ApiError::new(
            ErrorCode::Internal,
            "the session command failed",
        )),
    }
}

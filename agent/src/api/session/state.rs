//! Capture and restore of a session's state (what snapshots keep and forks get back).
//!
//! `GET /v1/sessions/{id}/state` captures a session between two commands (it takes the
//! session's pipes like a command does, so it waits for a running one): its directory
//! from `/proc/<shell>/cwd`, its functions from `declare -f` in bash, and its exported
//! variables from a child the shell starts, the agent binary itself as `orchard-agent
//! --print-env0`, which writes the environment it was given NUL-separated. That is
//! exactly what the shell exports, any byte in any value, without parsing shell quoting
//! (`export -p`, `env` and `set` all print something a parser would have to undo).
//! `POST /v1/sessions` with `restore` starts the shell again under the same id, in that
//! directory, with exactly that environment (not added to the agent's), then defines
//! the functions again as its first command.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::Json;
use orchard_protocol::session::{SessionInfo, SessionState};
use orchard_protocol::ErrorCode;
use tokio::sync::Notify;

use super::shell::{run_locked, start_shell, CancelOnDrop, KillShell, Session, Sessions};
use crate::api::registry::is_valid_id;
use crate::error::{ApiError, ApiResult};
use crate::proc::spawn::sh_quote;

/// Longest id a restored session may have.
const MAX_ID_LEN: usize = 64;
/// Shell variables of the agent's command framing: never part of a captured
/// environment (`__orchard_c` is exported only under `set -a`), nor is `_`, which bash
/// sets to each command's last argument.
const NOT_CAPTURED: &[&str] = &["_", "__orchard_c"];
/// Prints the shell's functions as shell text in bash, nothing in other shells (POSIX
/// sh cannot list them).
const FUNCTIONS_COMMAND: &str = "if [ -n \"${BASH_VERSION-}\" ]; then builtin declare -f; fi";

/// `POST /v1/sessions` with `restore`: the shell of `restored` started again, its
/// shell-maintained variables and functions set up as its first command (not counted
/// in `commands`), then registered under its id.
pub(super) async fn restore(sessions: &Sessions, restored: SessionState) -> ApiResult<SessionInfo> {
    let SessionState {
        id,
        shell,
        cwd,
        env,
        functions,
    } = restored;
    if !is_valid_id(&id, MAX_ID_LEN) {
        return Err(ApiError::invalid(format!(
            "a session id must be 1 to {MAX_ID_LEN} of A-Z a-z 0-9 . _ -, not {id:?}"
        )));
    }
    // Early and cheap; `insert_with` checks again, atomically, at the end.
    if sessions.table.0.get(&id).is_ok() {
        return Err(ApiError::new(
            ErrorCode::AlreadyExists,
            format!("a session with id {id} exists"),
        ));
    }
    let script = restore_script(&env, &functions);
    let mut started = start_shell(&sessions.reaper, shell, Some(cwd), env, true)?;
    // Killed if this request is dropped or fails before the session is registered.
    let mut guard = KillShell(Some(started.pid));
    let timeout = Duration::from_millis(sessions.limits.default_timeout_ms);
    let cap = sessions.limits.max_output_bytes as usize;
    let ran = run_locked(
        started.pid,
        &started.exit,
        &mut started.io,
        &script,
        timeout,
        cap,
        &Notify::new(),
    )
    .await;
    if ran.exit_code != Some(0) || !ran.alive {
        let status = match ran.exit_code {
            Some(code) => format!("exit code {code}"),
            None => "the shell exited".to_string(),
        };
        let (stderr, _) = ran.stderr.finish();
        return Err(ApiError::invalid(format!(
            "restoring session {id}: defining its functions failed ({status}): {}",
            String::from_utf8_lossy(&stderr).trim_end()
        )));
    }
    let session = sessions
        .table
        .0
        .insert_with(Some(id), |id| started.into_session(id))?;
    guard.0 = None;
    Ok(session.info())
}

/// The first command of a restored shell: `SHLVL` as captured (shells add one to it as
/// they start: without this every restore would add one more), then the functions.
fn restore_script(env: &BTreeMap<String, String>, functions: &str) -> String {
    let shlvl = match env.get("SHLVL") {
        Some(level) => format!("SHLVL={}", sh_quote(level)),
        None => "unset SHLVL".to_string(),
    };
    format!("{shlvl}\n{functions}")
}

/// `GET /v1/sessions/{id}/state`.
pub(super) async fn capture(
    State(sessions): State<Sessions>,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionState>> {
    let session = sessions.table.0.get(&id)?;
    let limits = &sessions.limits;
    let timeout = Duration::from_millis(limits.default_timeout_ms);
    // A state larger than a request body could not be restored.
    let cap = limits.max_body_bytes as usize;
    // Its own task, as a command's (see `run`): what it runs in the shell is read to
    // its end even when the client gives up.
    let cancel = Arc::new(Notify::new());
    let _cancel_on_drop = CancelOnDrop(cancel.clone());
    match tokio::spawn(capture_state(session, timeout, cap, cancel)).await {
        Ok(result) => result.map(Json),
        Err(_) => Err(ApiError::new(
            ErrorCode::Internal,
            "capturing the session's state failed",
        )),
    }
}

/// The session's state, read between two of its commands.
async fn capture_state(
    session: Arc<Session>,
    timeout: Duration,
    cap: usize,
    cancel: Arc<Notify>,
) -> ApiResult<SessionState> {
    let mut io = session.io.lock().await;
    session.check_alive()?;
    let exe = std::env::current_exe().map_err(|err| {
        ApiError::new(
            ErrorCode::Internal,
            format!(
                "finding the agent's own binary: {}",
                crate::error::describe_io(&err)
            ),
        )
    })?;
    let exe = exe
        .to_str()
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "the agent's own path is not UTF-8"))?;
    let dump = format!("command {} --print-env0", sh_quote(exe));
    let mut output = Vec::new();
    for command in [dump.as_str(), FUNCTIONS_COMMAND] {
        let ran = run_locked(
            session.pid,
            &session.exit,
            &mut io,
            command,
            timeout,
            cap,
            &cancel,
        )
        .await;
        if !ran.alive {
            session.alive.store(false, Ordering::Relaxed);
            session.check_alive()?;
        }
        let (stdout, gap) = ran.stdout.finish();
        let failed = if ran.timed_out {
            Some("timed out".to_string())
        } else if gap.is_some() {
            Some(format!("wrote more than {cap} bytes"))
        } else if ran.exit_code != Some(0) {
            let (stderr, _) = ran.stderr.finish();
            Some(format!(
                "exit code {:?}: {}",
                ran.exit_code,
                String::from_utf8_lossy(&stderr).trim_end()
            ))
        } else {
            None
        };
        if let Some(why) = failed {
            return Err(ApiError::new(
                ErrorCode::Internal,
                format!("capturing session {}: `{command}` {why}", session.id),
            ));
        }
        output.push(stdout);
    }
    let cwd = shell_cwd(session.pid).await?;
    let functions = String::from_utf8_lossy(&output[1]).into_owned();
    Ok(SessionState {
        id: session.id.clone(),
        shell: session.shell.clone(),
        cwd,
        env: parse_env0(&output[0]),
        functions,
    })
}

/// The shell's working directory, exactly, from `/proc/<pid>/cwd`. Read as the image's
/// user: the agent is root without CAP_SYS_PTRACE, which the kernel asks of root for
/// the links of another user's process, but not of that user.
async fn shell_cwd(pid: i32) -> ApiResult<String> {
    let link = format!("/proc/{pid}/cwd");
    let read = {
        let link = link.clone();
        crate::pid1::fsuser::blocking(move || std::fs::read_link(link)).await
    };
    let cwd = match read {
        Ok(Ok(cwd)) => cwd,
        Ok(Err(err)) => return Err(ApiError::io("reading", &link, &err)),
        Err(_) => {
            return Err(ApiError::new(
                ErrorCode::Internal,
                format!("reading {link} failed"),
            ))
        }
    };
    cwd.into_os_string().into_string().map_err(|cwd| {
        ApiError::new(
            ErrorCode::Internal,
            format!(
                "the session's working directory {} is not UTF-8",
                cwd.to_string_lossy()
            ),
        )
    })
}

/// `NAME=VALUE\0...` as written by `orchard-agent --print-env0`: entries that are not
/// UTF-8 and the agent's own ([`NOT_CAPTURED`]) left out.
fn parse_env0(dump: &[u8]) -> BTreeMap<String, String> {
    dump.split(|b| *b == 0)
        .filter_map(|entry| std::str::from_utf8(entry).ok()?.split_once('='))
        .filter(|(name, _)| !name.is_empty() && !NOT_CAPTURED.contains(name))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_env_dump_is_parsed_exactly_and_leaves_out_what_is_ours() {
        let dump = b"A=1\0B=x=y\nz \0_=/bin/env\0__orchard_c=pwd\0BAD=\xff\0EMPTY=\0\0";
        let env = parse_env0(dump);
        let expected: BTreeMap<String, String> = [("A", "1"), ("B", "x=y\nz "), ("EMPTY", "")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(env, expected);
    }

    #[test]
    fn a_restore_sets_shlvl_back_before_the_functions() {
        let mut env = BTreeMap::new();
        assert_eq!(
            restore_script(&env, "f () { :; }"),
            "unset SHLVL\nf () { :; }"
        );
        env.insert("SHLVL".to_string(), "2".to_string());
        assert_eq!(restore_script(&env, ""), "SHLVL='2'\n");
    }
}

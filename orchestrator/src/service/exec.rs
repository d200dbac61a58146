//! How a compatible job runs (its worker, which takes it from the queue, is
//! [`super::worker`]): through the agent as `bash -c` (a login shell as
//! Orchard runs it when asked: [`orchard_protocol::login`]; `sh` when the image has no
//! bash), in the sandbox's default working directory
//! (`/workspace` unless the operator set another). A list command is quoted element by
//! element. A command killed by its time limit ends as Orchard reports it: exit code
//! 124, stderr ending with `Command timed out after Ns and was killed`, and the job's
//! `error` `Command timed out after Ns`. Output is kept up to the configured cap per
//! stream (64 MiB by default; the job says `output_truncated` past it).
//!
//! How a job ends is an [`Outcome`], which [`Service::finish_job`] writes. A command
//! whose connection broke, or whose worker's replica died, runs on in the agent under
//! the job's id: [`collect`] fetches its result there (or ends the job with
//! [`ORPHANED_ERROR`]). Both live here, below the worker, which only schedules runs.

use std::time::{Duration, Instant};

use orchard_client::ClientError;
use orchard_protocol::compat::CompatCommand;
use orchard_protocol::exec::timeout_error;
use orchard_protocol::login::{filter_login_noise, login_shell_argv};
use orchard_protocol::{Command, ErrorCode, ExecRequest, ExecResult};

use crate::state::{JobOptions, JobRecord, Lease, SandboxRecord};

use super::handle::Service;
use super::runtime::Live;

/// How a job ended: `exit_code` and output when it ran, `error` when it could not run
/// or timed out, `truncated` when the output passed the cap.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Its exit code (128 + signal when killed).
    pub exit_code: Option<i32>,
    /// Its output.
    pub stdout: String,
    /// Its error output.
    pub stderr: String,
    /// Why it could not run, or its time-out.
    pub error: Option<String>,
    /// A stream passed the cap.
    pub truncated: bool,
}

/// How much longer than its own wait a collecting call may take.
const COLLECT_SLACK: std::time::Duration = std::time::Duration::from_secs(10);

/// Error of a running job whose worker stopped without finishing it.
pub const ORPHANED_ERROR: &str = "the orchestrator replica running this job stopped or lost \
    its lease before the job finished; the command may have run in part";

/// `s` quoted for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@%+,".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The script a command runs as.
pub fn script(command: &CompatCommand) -> String {
    match command {
        CompatCommand::Shell(s) => s.clone(),
        CompatCommand::Argv(v) => v
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// Runs `job` in `rec`'s agent and finishes it (refused if `lease` was taken over).
pub(super) async fn run(
    service: &Service,
    live: &Live,
    job: JobRecord,
    rec: &SandboxRecord,
    lease: &Lease,
) {
    let started = Instant::now();
    let mut opts = job.options.clone();
    let script = script(&job.job.command);
    let argv = if opts.login_shell {
        login_shell_argv(&live.shell, &script)
    } else {
        vec![live.shell.clone(), "-c".into(), script]
    };
    let timeout = job_timeout(service, &opts);
    let default_cwd = opts.cwd.is_none();
    let mut req = ExecRequest {
        command: Command::Argv(argv),
        cwd: Some(match &opts.cwd {
            Some(c) => Service::resolve(live, c),
            None => Service::default_dir(live).to_string(),
        }),
        env: std::mem::take(&mut opts.env),
        timeout_ms: Some(timeout.as_millis().max(1) as u64),
        max_output_bytes: Some(service.config().job_output_cap),
        // Orchard's convention: exit code 124 and a last stderr line.
        timeout_exit_124: true,
        // The command outlives this replica: if it dies, the job's next worker
        // collects the result from the agent under this id (`collect`).
        result_id: Some(job.job.job_id.clone()),
        ..Default::default()
    };
    let mut result = bounded_exec(live, &req, timeout).await;
    if matches!(&result, Err(e) if refuses_result_id(e)) {
        // An agent older than `result_id` (a sandbox made before an upgrade): run the
        // job as before; only its takeover by another replica is lost.
        req.result_id = None;
        result = bounded_exec(live, &req, timeout).await;
    }
    if default_cwd && matches!(&result, Err(e) if e.code() == Some(ErrorCode::CwdNotFound)) {
        // The command before removed the default directory: run in / rather than fail.
        req.cwd = Some("/".into());
        result = bounded_exec(live, &req, timeout).await;
    }
    service
        .metrics()
        .exec_compat_seconds
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(r) => {
            let outcome = outcome(r, &opts, timeout);
            service.finish_job(job, outcome, Some(lease)).await;
        }
        Err(e) => {
            let deleted = !service.is_current(rec).await;
            if !deleted && req.result_id.is_some() && !matches!(e, ClientError::Api { .. }) {
                // The connection failed, not the command: it runs on in the agent
                // under the job's id. Its real result, once it ends, rather than a
                // failure while it still runs (and the next job beside it).
                let outcome = collect(service, &rec.id, &job, lease).await;
                service.finish_job(job, outcome, Some(lease)).await;
                return;
            }
            let message = if deleted {
                "the sandbox was deleted while the job ran".to_string()
            } else {
                match &e {
                    ClientError::Api { body, .. } => {
                        format!("the command could not be run: {}", body.message)
                    }
                    e => format!("the sandbox's agent could not be reached: {e}"),
                }
            };
            let outcome = Outcome {
                error: Some(message),
                ..Outcome::default()
            };
            service.finish_job(job, outcome, Some(lease)).await;
        }
    }
}

/// The outcome of an orphaned `job` of sandbox `id`: its command's result, from the
/// agent (waiting while it still runs, the lease renewed meanwhile, up to the job's time
/// limit and the agent's grace), or why there is none.
pub(super) async fn collect(
    service: &Service,
    id: &str,
    job: &JobRecord,
    lease: &Lease,
) -> Outcome {
    let orphaned = |why: Option<String>| Outcome {
        error: Some(match why {
            Some(why) => format!("{ORPHANED_ERROR} ({why})"),
            None => ORPHANED_ERROR.to_string(),
        }),
        ..Outcome::default()
    };
    let live = match crate::state::until_answered(|| service.store().sandbox(id)).await {
        Some(Some(rec)) => match service.agent_of(&rec.value) {
            Ok(live) => live,
            Err(e) => return orphaned(Some(e.public_message())),
        },
        _ => return orphaned(None),
    };
    let timeout = job_timeout(service, &job.options);
    let deadline = Instant::now() + timeout + AGENT_GRACE;
    let poll = service.policy().worker_lease / 3;
    loop {
        let wait = poll.as_millis().max(1) as u64;
        // Bounded: a half-open connection must not hold the worker forever.
        let asked = live.agent.exec_result(&job.job.job_id, wait);
        let answer = match tokio::time::timeout(poll + COLLECT_SLACK, asked).await {
            Ok(a) => a,
            Err(elapsed) => Err(orchard_client::ClientError::transport(
                "the agent did not answer in time",
                elapsed,
            )),
        };
        match answer {
            Ok(kept) => {
                if let Some(r) = kept.result {
                    return outcome(r, &job.options, timeout);
                }
            }
            Err(e) if e.code() == Some(ErrorCode::NotFound) => return orphaned(None),
            Err(e) => {
                let why = format!("its result could not be collected from the agent: {e}");
                return orphaned(Some(why));
            }
        }
        if Instant::now() >= deadline {
            return orphaned(Some("its command ran past its time limit".into()));
        }
        if !service.renew_worker_lease(lease).await {
            return orphaned(Some("this replica lost the lease too".into()));
        }
    }
}

/// Whether `e` is an agent refusing the `result_id` field it does not know. The one
/// decision here on an error's words, and not ours: an agent older than the field
/// answers serde's unknown-field refusal, whose code says only "bad JSON"; the field's
/// name in it is the only sign, and no newer agent sends that answer.
fn refuses_result_id(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { body, .. }
        if matches!(body.code, ErrorCode::InvalidJson | ErrorCode::InvalidArgument)
            && body.message.contains("result_id"))
}

/// The time limit of a job with `opts`.
pub(super) fn job_timeout(service: &Service, opts: &JobOptions) -> Duration {
    opts.timeout_ms
        .map_or(service.policy().exec_timeout, Duration::from_millis)
}

/// The outcome of a job with `opts` and time limit `timeout` whose command ended with `r`.
pub(super) fn outcome(r: ExecResult, opts: &JobOptions, timeout: Duration) -> Outcome {
    let exit_code = r.exit_code.or(r.signal.map(|s| 128 + s));
    let error = r.timed_out.then(|| timeout_error(timeout));
    let truncated = r.stdout.truncated || r.stderr.truncated;
    let mut stderr = job_text(&r.stderr);
    if opts.login_shell {
        stderr = filter_login_noise(&stderr);
    }
    Outcome {
        exit_code,
        stdout: job_text(&r.stdout),
        stderr,
        error,
        truncated,
    }
}

/// A stream as the job holds it: text with invalid UTF-8 replaced and, where the agent
/// cut the middle of a stream over the cap, a line saying how much was left out.
fn job_text(out: &orchard_protocol::Output) -> String {
    let Ok(mut bytes) = out.bytes() else {
        return String::new();
    };
    if let Some(at) = out.omitted_at {
        let at = (at as usize).min(bytes.len());
        let left_out = out.total_bytes.saturating_sub(bytes.len() as u64);
        let note = format!(
            "\n[orchard: {left_out} bytes of output left out here; a job keeps at most {} bytes per stream]\n",
            bytes.len()
        );
        bytes.splice(at..at, note.into_bytes());
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// How long past its own time limit an exec may go unanswered before the job fails:
/// the agent kills at the limit, so only a wedged agent or connection gets here.
pub(super) const AGENT_GRACE: Duration = Duration::from_secs(30);

/// An exec that cannot hang a job forever.
async fn bounded_exec(
    live: &Live,
    req: &ExecRequest,
    limit: Duration,
) -> Result<orchard_protocol::ExecResult, orchard_client::ClientError> {
    match tokio::time::timeout(limit + AGENT_GRACE, live.agent.exec(req)).await {
        Ok(r) => r,
        Err(elapsed) => Err(orchard_client::ClientError::transport(
            format!(
                "no answer within {} s of the command's time limit",
                AGENT_GRACE.as_secs()
            ),
            elapsed,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_stream_says_what_was_left_out() {
        let out = orchard_protocol::Output::from_bytes(b"headtail".to_vec(), 20, Some(4));
        assert_eq!(
            job_text(&out),
            "head\n[orchard: 12 bytes of output left out here; a job keeps at most 8 bytes per stream]\ntail"
        );
        let whole = orchard_protocol::Output::from_bytes(b"all".to_vec(), 3, None);
        assert_eq!(job_text(&whole), "all");
    }

    #[test]
    fn an_agent_older_than_result_id_is_recognised_by_its_refusal() {
        // What an older agent answers: serde's unknown-field error.
        let err = |code, message: &str| ClientError::Api {
            status: hyper::StatusCode::BAD_REQUEST,
            body: orchard_protocol::ErrorBody::new(code, message.to_string()),
        };
        let old = err(
            ErrorCode::InvalidJson,
            "invalid request body: unknown field `result_id`, expected one of `command`",
        );
        assert!(refuses_result_id(&old));
        assert!(!refuses_result_id(&err(
            ErrorCode::CwdNotFound,
            "no /workspace"
        )));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!refuses_result_id(&ClientError::transport("reset", reset)));
    }

    #[test]
    fn list_commands_are_quoted_element_by_element() {
        let c = CompatCommand::Argv(vec![
            "echo".into(),
            "a b".into(),
            "it's".into(),
            "$HOME".into(),
            "".into(),
            "plain-arg=1".into(),
        ]);
        assert_eq!(script(&c), r#"echo 'a b' 'it'\''s' '$HOME' '' plain-arg=1"#);
        assert_eq!(
            script(&CompatCommand::Shell("echo $HOME".into())),
            "echo $HOME"
        );
    }
}

//! The results of commands run by `POST /v1/exec` with a `result_id`, which
//! `GET /v1/exec/results/{id}` collects (both routes are [`crate::api::exec`]'s): a
//! result that outlives its caller. The orchestrator names each compatible job's
//! exec after the job, so that when the replica running the job dies mid-command,
//! another replica collects the real output instead of failing the job.
//!
//! Invariants:
//! - An id names one command at a time: an exec whose `result_id` runs or is kept is
//!   refused (`already_exists`), so a result is never mistaken for another's.
//! - A command with an id runs in its own task to its end whatever its caller does; the
//!   handler only waits for it (an ordinary exec ends with its handler).
//! - A result its caller received is not kept: the common case holds no memory. One
//!   whose caller went away first is kept, the newest [`KEPT_RESULTS`] for
//!   [`KEPT_FOR_SECS`] seconds, so what the agent holds for dead callers is bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use orchard_protocol::exec::{KEPT_FOR_SECS, KEPT_RESULTS};
use orchard_protocol::{ErrorCode, ExecResult};
use tokio::sync::watch;

use crate::error::{ApiError, ApiResult};

/// Longest `result_id`.
const MAX_ID_LEN: usize = 128;

/// A result, once there is one.
pub type Slot = watch::Receiver<Option<Arc<ExecResult>>>;

/// The commands with an id: running, and ended ones kept for a caller that left.
#[derive(Default)]
pub struct KeptTable {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<String, Slot>,
    /// Kept results by age, oldest first, with when each ended.
    ended: VecDeque<(String, Instant)>,
}

/// A registered command: publishes its result, then is kept or forgotten.
pub struct Running {
    id: String,
    tx: watch::Sender<Option<Arc<ExecResult>>>,
    /// True while the caller waits; its [`Caller`] clears it when dropped.
    attached: Arc<AtomicBool>,
}

/// The waiting caller's side; dropping it (the connection went away) means the result,
/// when it comes, is kept.
pub struct Caller {
    rx: Slot,
    attached: Arc<AtomicBool>,
}

impl Drop for Caller {
    fn drop(&mut self) {
        self.attached.store(false, Ordering::SeqCst);
    }
}

impl Caller {
    /// The result, when the command ends.
    pub async fn result(&mut self) -> Option<Arc<ExecResult>> {
        let r = self.rx.wait_for(Option::is_some).await.ok()?;
        r.clone()
    }
}

/// Checks an id: 1 to 128 of `A-Z a-z 0-9 . _ -`.
fn check_id(id: &str) -> ApiResult<()> {
    if crate::api::registry::is_valid_id(id, MAX_ID_LEN) {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "result_id must be 1 to {MAX_ID_LEN} of A-Z a-z 0-9 . _ -"
        )))
    }
}

impl KeptTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers the command `id` before it starts; `already_exists` when the id runs
    /// or is kept.
    pub fn begin(&self, id: &str) -> ApiResult<(Running, Caller)> {
        check_id(id)?;
        let mut inner = self.lock();
        inner.prune(Instant::now());
        if inner.slots.contains_key(id) {
            return Err(ApiError::new(
                ErrorCode::AlreadyExists,
                format!("a command with result_id {id} is running or its result is kept"),
            ));
        }
        let (tx, rx) = watch::channel(None);
        inner.slots.insert(id.to_string(), rx.clone());
        let attached = Arc::new(AtomicBool::new(true));
        let running = Running {
            id: id.to_string(),
            tx,
            attached: attached.clone(),
        };
        Ok((running, Caller { rx, attached }))
    }

    /// Forgets a command that never started (its spawn failed).
    pub fn abandon(&self, running: Running) {
        self.lock().slots.remove(&running.id);
    }

    /// Publishes the result of `running`; keeps it when its caller is gone.
    pub fn end(&self, running: Running, result: ExecResult) {
        // Read before publishing: a caller attached now is still waiting, so it will
        // receive the result (unless it goes in the instant between: then the result is
        // lost, and a collector is told it is unknown, never given a wrong one).
        let caller_waits = running.attached.load(Ordering::SeqCst);
        let _ = running.tx.send(Some(Arc::new(result)));
        let mut inner = self.lock();
        let now = Instant::now();
        if caller_waits {
            inner.slots.remove(&running.id);
        } else {
            inner.ended.push_back((running.id, now));
            while inner.ended.len() > KEPT_RESULTS {
                if let Some((old, _)) = inner.ended.pop_front() {
                    inner.slots.remove(&old);
                }
            }
        }
        inner.prune(now);
    }

    /// The result of `id`, running or kept; `not_found` when it is neither.
    pub fn get(&self, id: &str) -> ApiResult<Slot> {
        let mut inner = self.lock();
        inner.prune(Instant::now());
        inner.slots.get(id).cloned().ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!(
                    "no command with result_id {id}: unknown, its caller received its \
                     result, or it was kept longer than {KEPT_FOR_SECS} s"
                ),
            )
        })
    }

    /// Commands running or kept now.
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// Drops kept results past their time. Done on every call, so no timer is needed:
    /// an idle agent holds at most [`KEPT_RESULTS`] results until its next call.
    fn prune(&mut self, now: Instant) {
        let keep_for = Duration::from_secs(KEPT_FOR_SECS);
        while let Some((id, at)) = self.ended.front() {
            if now.duration_since(*at) < keep_for {
                break;
            }
            let id = id.clone();
            self.ended.pop_front();
            self.slots.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_protocol::Output;

    fn result(code: i32) -> ExecResult {
        ExecResult {
            exit_code: Some(code),
            signal: None,
            timed_out: false,
            duration_ms: 1.0,
            pid: 7,
            stdout: Output::from_bytes(b"out".to_vec(), 3, None),
            stderr: Output::from_bytes(Vec::new(), 0, None),
        }
    }

    #[tokio::test]
    async fn a_received_result_is_not_kept_and_an_abandoned_one_is() {
        let t = KeptTable::default();
        let (running, mut caller) = t.begin("job-1").unwrap();
        assert_eq!(
            t.begin("job-1").err().map(|e| e.code),
            Some(ErrorCode::AlreadyExists)
        );
        t.end(running, result(0));
        assert_eq!(caller.result().await.unwrap().exit_code, Some(0));
        assert!(t.is_empty(), "received, so not kept");

        let (running, caller) = t.begin("job-2").unwrap();
        drop(caller);
        t.end(running, result(3));
        let kept = t.get("job-2").unwrap();
        assert_eq!(kept.borrow().as_ref().unwrap().exit_code, Some(3));
        assert_eq!(
            t.begin("job-2").err().map(|e| e.code),
            Some(ErrorCode::AlreadyExists)
        );
    }

    #[tokio::test]
    async fn only_the_newest_abandoned_results_are_kept() {
        let t = KeptTable::default();
        for i in 0..KEPT_RESULTS + 3 {
            let (running, caller) = t.begin(&format!("j{i}")).unwrap();
            drop(caller);
            t.end(running, result(i as i32));
        }
        assert_eq!(t.len(), KEPT_RESULTS);
        assert!(t.get("j0").is_err());
        assert!(t.get(&format!("j{}", KEPT_RESULTS + 2)).is_ok());
    }

    #[test]
    fn ids_are_checked() {
        let t = KeptTable::default();
        for bad in ["", "a/b", "a b", &"x".repeat(MAX_ID_LEN + 1)] {
            assert_eq!(
                t.begin(bad).err().map(|e| e.code),
                Some(ErrorCode::InvalidArgument),
                "{bad:?}"
            );
        }
        assert!(t.begin("job-0a1b.c_d").is_ok());
    }
}

//! Exec requests, and the time limit every call of a test keeps so that a bug shows as
//! a failure instead of a hung test run.

use std::future::Future;
use std::time::Duration;

use orchard_protocol::ExecRequest;

/// Longest any single API call of a test may take before the test fails instead of
/// hanging.
pub const CALL_LIMIT: Duration = Duration::from_secs(60);

/// Awaits `fut`, failing the test if it takes longer than `limit`.
pub async fn within<F: Future>(limit: Duration, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("call did not finish within {limit:?}"),
    }
}

/// An exec request of a shell string.
pub fn shell(script: &str) -> ExecRequest {
    ExecRequest {
        command: orchard_protocol::Command::Shell(script.into()),
        ..Default::default()
    }
}

/// An exec request of an argv.
pub fn argv(args: &[&str]) -> ExecRequest {
    ExecRequest {
        command: orchard_protocol::Command::Argv(args.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}

/// Runs `fut` to its end on a new thread with a runtime of its own; answers its output,
/// or the panic that ended the thread. For `Drop` of a fixture, which may run inside the
/// test's runtime (where blocking on a future panics) and while the test panics (where
/// a second panic aborts, so the caller decides what to do with one).
pub fn block_on_own_runtime<F>(fut: F) -> std::thread::Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime of its own")
            .block_on(fut)
    })
    .join()
}

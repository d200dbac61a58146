//! A thread of its own for the bulk work of request handlers: escaping a big job's
//! output for its body ([`super::job_body`]).
//!
//! Why not the blocking pool: its threads run at the server's priority, as many at
//! once as there are bodies being sent, and issue 30 measured four reads of one big
//! job taking both cores while another tenant's exec p99 rose sixfold. Here the work
//! runs one task at a time, in the order asked (each tenant has at most one task in
//! line, so tenants take turns), on one background thread
//! ([`orchard_sched::make_background_thread`]: nice 10, the kernel's default slice): it
//! uses what the request threads and the sandboxes leave, and yields to them at once
//! when they wake.

use std::sync::mpsc;

use tokio::sync::oneshot;

type Task = Box<dyn FnOnce() + Send>;

/// The bulk thread; it ends when this is dropped (after its tasks in line).
pub struct Bulk {
    tasks: mpsc::Sender<Task>,
}

impl Bulk {
    /// Starts the thread.
    pub fn start() -> std::io::Result<Bulk> {
        let (tasks, line) = mpsc::channel::<Task>();
        std::thread::Builder::new()
            .name("orchard-bulk".into())
            .spawn(move || {
                // Best effort: without it the work is only less polite.
                if let Err(e) = orchard_sched::make_background_thread() {
                    tracing::warn!(error = %e, "could not lower the bulk thread's priority");
                }
                while let Ok(task) = line.recv() {
                    task();
                }
            })?;
        Ok(Bulk { tasks })
    }

    /// Runs `work` on the bulk thread after the tasks already in line; `None` if the
    /// thread is gone (it ended with a panic).
    pub async fn run<T, F>(&self, work: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (done, answer) = oneshot::channel();
        let task: Task = Box::new(move || {
            let _ = done.send(work());
        });
        self.tasks.send(task).ok()?;
        answer.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_in_order_on_a_low_priority_thread() {
        let bulk = Bulk::start().unwrap();
        let (a, b) = tokio::join!(
            bulk.run(|| (std::thread::current().name().map(String::from), 1)),
            bulk.run(|| rustix::process::getpriority_process(None).unwrap()),
        );
        assert_eq!(a, Some((Some("orchard-bulk".to_string()), 1)));
        assert_eq!(b, Some(orchard_sched::BACKGROUND_NICE));
    }
}

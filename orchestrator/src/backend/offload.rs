//! A backend whose slow operations run on a runtime of their own, off the threads that
//! answer requests.
//!
//! Why (issue 30): a create or a delete on the local backend is mostly waiting (for
//! runc, for the agent), but between its waits it runs system calls that block the
//! thread for milliseconds: `fork` of the whole server to start runc (10 to 15 ms when
//! both cores are busy), `mount`, `rmdir` of a sandbox's tree, state files. On the
//! server's one request thread those stalls queued every other tenant's calls behind
//! them: tenant A's 50 creates at once took tenant B's exec p99 from 2.5 ms to over
//! 100 ms. Here those operations run on [`THREADS`] threads of their own, with the
//! kernel's default scheduler slice (the request thread asks for a short one and so
//! preempts them when a request wakes it), and the request thread only awaits them.
//!
//! Cancellation is kept: when the caller stops waiting (a timeout, a client gone), the
//! operation's task is aborted at its next await, exactly as dropping the future did
//! when it ran inline, so a create given up on cannot finish behind its caller's back.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

use super::{
    Backend, BackendError, BackendFuture, BackendSandbox, BackendSnapshot, Capacity, ClusterNodes,
    CreateSpec, DiskRoom, SnapshotSpec,
};

/// Threads of the backend's runtime: creates are mostly waits, so two keep many in
/// flight; more would only add threads contending with requests for the same cores.
pub const THREADS: usize = 2;

/// [`Backend`] `inner`, its slow operations run on a runtime of their own.
pub struct Offload {
    inner: Arc<dyn Backend>,
    handle: Handle,
    /// Shut down (without waiting) when this is dropped; a runtime cannot be dropped
    /// from inside another's task, which is where the server drops its backend.
    runtime: Mutex<Option<Runtime>>,
}

impl Offload {
    /// Wraps `inner`, starting the runtime.
    pub fn new(inner: Arc<dyn Backend>) -> std::io::Result<Offload> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(THREADS)
            .thread_name("orchard-backend")
            .on_thread_start(|| {
                // Nice 10 and the default slice: these threads must not preempt request
                // threads, and what they start (runc, a starting sandbox) inherits both
                // (runc.rs spawns it without running code between fork and exec).
                if let Err(e) = orchard_sched::make_background_thread() {
                    tracing::warn!(error = %e, "could not lower the backend threads' priority");
                }
            })
            .enable_all()
            .build()?;
        Ok(Offload {
            inner,
            handle: runtime.handle().clone(),
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// Runs `op` of the inner backend on the backend's runtime.
    fn run<T, F, Fut>(&self, op: F) -> BackendFuture<'_, T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn Backend>) -> Fut,
        Fut: Future<Output = Result<T, BackendError>> + Send + 'static,
    {
        let task = AbortOnDrop(self.handle.spawn(op(self.inner.clone())));
        Box::pin(async move {
            let mut task = task;
            match (&mut task.0).await {
                Ok(answer) => answer,
                Err(e) => Err(BackendError::failed_by(
                    format!("the backend's task ended early: {e}"),
                    e,
                )),
            }
        })
    }
}

/// Aborts the task when the caller stops waiting for it.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Drop for Offload {
    fn drop(&mut self) {
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(rt) = runtime {
            rt.shutdown_background();
        }
    }
}

impl Backend for Offload {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn pulls_images(&self) -> bool {
        self.inner.pulls_images()
    }

    fn create(&self, spec: CreateSpec) -> BackendFuture<'_, BackendSandbox> {
        self.run(|b| async move { b.create(spec).await })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        let id = id.to_string();
        self.run(|b| async move { b.delete(&id).await })
    }

    fn list(&self) -> BackendFuture<'_, Vec<BackendSandbox>> {
        self.run(|b| async move { b.list().await })
    }

    fn recover(&self) -> BackendFuture<'_, Vec<String>> {
        self.run(|b| async move { b.recover().await })
    }

    fn shutdown(&self) -> BackendFuture<'_, ()> {
        self.run(|b| async move { b.shutdown().await })
    }

    fn release(&self) -> BackendFuture<'_, ()> {
        self.run(|b| async move { b.release().await })
    }

    fn capacity(&self) -> Option<Capacity> {
        self.inner.capacity()
    }

    fn clamps_to_capacity(&self) -> bool {
        self.inner.clamps_to_capacity()
    }

    fn disk_room(&self, id: &str) -> Option<DiskRoom> {
        self.inner.disk_room(id)
    }

    fn nodes(&self) -> Option<ClusterNodes> {
        self.inner.nodes()
    }

    fn pause<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        let id = id.to_string();
        self.run(|b| async move { b.pause(&id).await })
    }

    fn resume<'a>(&'a self, id: &'a str) -> BackendFuture<'a, ()> {
        let id = id.to_string();
        self.run(|b| async move { b.resume(&id).await })
    }

    fn snapshot(&self, spec: SnapshotSpec) -> BackendFuture<'_, BackendSnapshot> {
        self.run(|b| async move { b.snapshot(spec).await })
    }

    fn snapshots(&self) -> BackendFuture<'_, Vec<BackendSnapshot>> {
        self.run(|b| async move { b.snapshots().await })
    }

    fn delete_snapshot<'a>(&'a self, id: &'a str) -> BackendFuture<'a, u64> {
        let id = id.to_string();
        self.run(|b| async move { b.delete_snapshot(&id).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::FakeBackend;

    #[tokio::test]
    async fn operations_run_on_the_backends_threads_and_a_dropped_call_is_aborted() {
        let fake = Arc::new(FakeBackend::tcp());
        let off = Offload::new(fake.clone()).unwrap();
        assert_eq!(off.name(), fake.name());
        // The inline calls answer the inner backend's figures.
        let nodes = crate::backend::ClusterNodes {
            incomplete: Some("x".into()),
            ..Default::default()
        };
        *fake.nodes.lock().unwrap() = Some(nodes.clone());
        assert_eq!(off.nodes(), Some(nodes));
        assert_eq!(off.capacity(), fake.capacity());
        // Runs elsewhere: the thread's name is the backend runtime's.
        let name = off
            .run(|_| async { Ok(std::thread::current().name().map(str::to_string)) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("orchard-backend"));
        // A call given up on stops: its task never reaches the end.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let call = off.run(|_| async move {
            std::future::pending::<()>().await;
            let _ = tx.send(());
            Ok(())
        });
        drop(call);
        assert!(
            rx.await.is_err(),
            "the task was aborted, dropping its sender"
        );
    }
}

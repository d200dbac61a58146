//! Runs of some work keyed by name, so concurrent requests for the same thing share
//! one: pulls of one name, downloads of one layer. The others wait on a watch channel
//! for the outcome and get the progress meanwhile; a cancelled leader hands over.
//! [`Progress`] is what the listeners of a pull are told.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::sync::lock;
use crate::ImageError;

/// Where a pull is, for a progress display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The normalised reference being pulled.
    pub reference: String,
    /// Digest of the layer blob this report is about.
    pub layer: String,
    /// Bytes of that layer received so far.
    pub layer_bytes_done: u64,
    /// Size of that layer blob.
    pub layer_bytes_total: u64,
    /// Layers complete (downloaded and unpacked, or already present).
    pub layers_done: usize,
    /// Layers in the image.
    pub layers_total: usize,
}

pub(super) type Listener = Arc<dyn Fn(Progress) + Send + Sync>;
pub(super) type Outcome<T> = Option<Result<T, ImageError>>;

/// Runs of some work keyed by name, so concurrent requests for the same thing share one.
pub(super) struct Flights<T> {
    map: Arc<Mutex<HashMap<String, FlightEntry<T>>>>,
}

struct FlightEntry<T> {
    outcome: watch::Receiver<Outcome<T>>,
    listeners: Arc<Mutex<Vec<Listener>>>,
}

pub(super) enum Role<T> {
    /// Do the work, then [`Flight::finish`].
    Leader(Flight<T>),
    /// Wait for the leader's outcome.
    Follower(watch::Receiver<Outcome<T>>),
}

/// The leader's handle. Dropping it without finishing (the leader was cancelled) wakes
/// the followers with a closed channel, and one of them takes over.
pub(super) struct Flight<T> {
    map: Arc<Mutex<HashMap<String, FlightEntry<T>>>>,
    key: String,
    outcome: watch::Sender<Outcome<T>>,
    listeners: Arc<Mutex<Vec<Listener>>>,
    finished: bool,
}

impl<T: Clone> Flights<T> {
    pub(super) fn new() -> Self {
        Flights {
            map: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    pub(super) fn join(&self, key: &str, listener: Option<Listener>) -> Role<T> {
        let mut map = lock(&self.map);
        if let Some(entry) = map.get(key) {
            if let Some(listener) = listener {
                lock(&entry.listeners).push(listener);
            }
            return Role::Follower(entry.outcome.clone());
        }
        let (sender, receiver) = watch::channel(None);
        let listeners = Arc::new(Mutex::new(listener.into_iter().collect()));
        map.insert(
            key.to_string(),
            FlightEntry {
                outcome: receiver,
                listeners: listeners.clone(),
            },
        );
        Role::Leader(Flight {
            map: self.map.clone(),
            key: key.to_string(),
            outcome: sender,
            listeners,
            finished: false,
        })
    }
}

/// Waits for a leader; `None` when it was cancelled without an outcome.
pub(super) async fn follow<T: Clone>(
    mut outcome: watch::Receiver<Outcome<T>>,
) -> Option<Result<T, ImageError>> {
    let value = outcome.wait_for(Option::is_some).await.ok()?;
    value.clone()
}

impl<T: Clone> Flight<T> {
    pub(super) fn finish(mut self, result: Result<T, ImageError>) -> Result<T, ImageError> {
        // Removing the entry first means a request arriving now starts afresh instead of
        // joining a finished run.
        lock(&self.map).remove(&self.key);
        self.finished = true;
        let _ = self.outcome.send(Some(result.clone()));
        result
    }

    /// Calls every listener (the leader's and the followers') with `progress`.
    pub(super) fn broadcaster(&self) -> Listener {
        let listeners = self.listeners.clone();
        Arc::new(move |progress: Progress| {
            let current: Vec<Listener> = lock(&listeners).clone();
            for listener in current {
                listener(progress.clone());
            }
        })
    }
}

impl<T> Drop for Flight<T> {
    fn drop(&mut self) {
        // After finish() a new leader may own the key; before, the entry is ours.
        if !self.finished {
            lock(&self.map).remove(&self.key);
        }
    }
}

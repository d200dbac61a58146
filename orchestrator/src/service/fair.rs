//! Create slots shared fairly between keys.
//!
//! A plain FIFO semaphore let one key's burst delay everyone else's creates (issue 30:
//! 200 creates of tenant A delayed tenant B's by 2.4 s). Here each key waits in its own
//! line, and a freed slot goes to the keys in turn (round robin over the keys that
//! wait), so a key's create waits for at most one create of each other waiting key per
//! slot, however long their lines are. Within a key, creates keep their order.
//!
//! Invariant: a slot is either counted in `free` or held by exactly one [`FairPermit`]
//! (or in flight to a waiter, whose channel gives it back when the waiter is gone).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Slots shared by keys in turn.
#[derive(Clone)]
pub struct FairSlots {
    inner: Arc<Mutex<State>>,
}

/// What the lock protects: the free slots and each key's line.
struct State {
    free: usize,
    /// Waiters by key, oldest first.
    lines: HashMap<String, VecDeque<oneshot::Sender<FairPermit>>>,
    /// Keys with waiters, in the order they are served.
    turn: VecDeque<String>,
}

/// A held slot; dropping it hands the slot to the next key in turn.
pub struct FairPermit {
    slots: Option<FairSlots>,
}

impl FairSlots {
    /// `n` slots (at least one).
    pub fn new(n: usize) -> FairSlots {
        FairSlots {
            inner: Arc::new(Mutex::new(State {
                free: n.max(1),
                lines: HashMap::new(),
                turn: VecDeque::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a slot for `key`.
    pub async fn acquire(&self, key: &str) -> FairPermit {
        loop {
            let rx = {
                let mut s = self.lock();
                if s.free > 0 && s.turn.is_empty() {
                    s.free -= 1;
                    return self.permit();
                }
                let (tx, rx) = oneshot::channel();
                if s.lines.get(key).is_none_or(VecDeque::is_empty) {
                    s.turn.push_back(key.to_string());
                }
                s.lines.entry(key.to_string()).or_default().push_back(tx);
                rx
            };
            // A sender dropped without a send gave no slot (nothing does that while
            // `self` lives): wait in line again rather than make a slot up.
            if let Ok(p) = rx.await {
                return p;
            }
        }
    }

    fn permit(&self) -> FairPermit {
        FairPermit {
            slots: Some(self.clone()),
        }
    }

    /// Slots free now.
    #[cfg(test)]
    fn available(&self) -> usize {
        self.lock().free
    }

    /// Gives a slot to the next waiting key in turn, or back to `free`.
    fn release(&self) {
        let mut s = self.lock();
        while let Some(key) = s.turn.pop_front() {
            let Some(line) = s.lines.get_mut(&key) else {
                continue;
            };
            let waiter = line.pop_front();
            let more = !line.is_empty();
            if more {
                s.turn.push_back(key.clone());
            } else {
                s.lines.remove(&key);
            }
            if let Some(tx) = waiter {
                // A waiter that went away (its create was cancelled) returns the permit
                // in the error; it is dropped outside the lock and released again.
                if let Err(permit) = tx.send(self.permit()) {
                    drop(s);
                    drop(permit);
                    return;
                }
                return;
            }
        }
        s.free += 1;
    }
}

impl Drop for FairPermit {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_keys_in_turn_not_to_the_longest_line() {
        let slots = FairSlots::new(1);
        let held = slots.acquire("a").await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // Five of a's creates queue first, then one of b's.
        for (i, key) in ["a", "a", "a", "a", "a", "b"].into_iter().enumerate() {
            let (mine, order) = (slots.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let p = mine.acquire(key).await;
                order.lock().unwrap().push(format!("{key}{i}"));
                drop(p);
            }));
            // Queued in this order: each task waits before the next is spawned.
            while slots
                .lock()
                .lines
                .values()
                .map(VecDeque::len)
                .sum::<usize>()
                < i + 1
            {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .unwrap()
                .unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(
            order[..2],
            ["a0".to_string(), "b5".to_string()],
            "{order:?}"
        );
        assert_eq!(slots.available(), 1, "every slot came back");
    }

    #[tokio::test]
    async fn a_cancelled_waiter_does_not_lose_the_slot() {
        let slots = FairSlots::new(1);
        let held = slots.acquire("a").await;
        let waiting = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire("b").await })
        };
        while slots.lock().turn.is_empty() {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        let _ = waiting.await;
        drop(held);
        assert_eq!(slots.available(), 1);
        let _again = tokio::time::timeout(Duration::from_secs(5), slots.acquire("c"))
            .await
            .unwrap();
    }
}

//! The store's one way to take a mutex.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, poisoned or not.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not make the store unusable: the guarded data (maps of
    // in-flight work, pins) stays consistent at every step.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

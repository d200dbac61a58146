//! One async lock per key (a tenant's name): work that must not overlap for one key
//! (its snapshot quota check) while other keys go on. A key's lock stays in the map
//! once made: there are as many as keys that ever used one (the configured tenants).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Async locks by key.
#[derive(Default)]
pub struct KeyedLock {
    /// The locks made so far. Held only to find or insert one.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyedLock {
    /// Waits for `key`'s lock; it is released when the guard is dropped.
    pub async fn lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_holder_per_key_and_keys_apart() {
        let locks = KeyedLock::default();
        let a = locks.lock("a").await;
        let _b = locks.lock("b").await;
        let again = tokio::time::timeout(std::time::Duration::from_millis(50), locks.lock("a"));
        assert!(again.await.is_err(), "a is held");
        drop(a);
        let _a = locks.lock("a").await;
    }
}

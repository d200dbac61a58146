//! A table of live things by agent-assigned id (background processes, sessions,
//! terminals): ids with a per-kind prefix, lookups that answer `not_found` in the kind's
//! words, and listings in creation order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use orchard_protocol::ErrorCode;

use crate::error::{ApiError, ApiResult};

/// Items of one kind by id.
pub struct Registry<T> {
    /// id -> item; locked only for lookups, inserts and removals, never across an await.
    items: Mutex<HashMap<String, Arc<T>>>,
    next: AtomicU64,
    prefix: &'static str,
    what: &'static str,
}

impl<T> Registry<T> {
    /// An empty table whose ids look like `{prefix}1` and whose lookups fail with
    /// "no {what} with id …".
    pub fn new(prefix: &'static str, what: &'static str) -> Self {
        Self {
            items: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            prefix,
            what,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<T>>> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh id.
    pub fn next_id(&self) -> String {
        format!(
            "{}{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Adds an item.
    pub fn insert(&self, id: String, item: Arc<T>) {
        self.lock().insert(id, item);
    }

    /// The item with `id`, or `not_found`.
    pub fn get(&self, id: &str) -> ApiResult<Arc<T>> {
        self.lock().get(id).cloned().ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("no {} with id {id}", self.what),
            )
        })
    }

    /// Removes an item.
    pub fn remove(&self, id: &str) -> Option<Arc<T>> {
        self.lock().remove(id)
    }

    /// Keeps only the items for which `keep` is true.
    pub fn retain(&self, mut keep: impl FnMut(&T) -> bool) {
        self.lock().retain(|_, item| keep(item));
    }

    /// Items tracked now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every item, in creation order.
    pub fn values(&self) -> Vec<Arc<T>> {
        let mut items: Vec<(u64, Arc<T>)> = self
            .lock()
            .iter()
            .map(|(id, item)| {
                let n = id[self.prefix.len().min(id.len())..]
                    .parse()
                    .unwrap_or(u64::MAX);
                (n, item.clone())
            })
            .collect();
        items.sort_by_key(|(n, _)| *n);
        items.into_iter().map(|(_, item)| item).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_and_listed_in_creation_order() {
        let r: Registry<u32> = Registry::new("x", "thing");
        for v in 0..12 {
            let id = r.next_id();
            r.insert(id, Arc::new(v));
        }
        let values: Vec<u32> = r.values().iter().map(|v| **v).collect();
        assert_eq!(values, (0..12).collect::<Vec<_>>());
        assert_eq!(*r.get("x3").unwrap(), 2);
        let err = r.get("x99").unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert_eq!(err.message, "no thing with id x99");
        r.retain(|v| v % 2 == 0);
        assert_eq!(r.len(), 6);
    }
}

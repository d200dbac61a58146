//! A table of live things by agent-assigned id (background processes, sessions,
//! terminals): ids with a per-kind prefix, lookups that answer `not_found` in the kind's
//! words, and listings in creation order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use orchard_protocol::ErrorCode;

use crate::error::{ApiError, ApiResult};

/// Whether `id` is 1 to `max_len` of `A-Z a-z 0-9 . _ -`: the ids a client may choose.
pub fn is_valid_id(id: &str, max_len: usize) -> bool {
    !id.is_empty()
        && id.len() <= max_len
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

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

    /// Adds the item `make` builds for its id: `id` when given (`already_exists` when it
    /// is taken), else a fresh one. Choosing and inserting under one lock means that a
    /// given id and a fresh one never race to the same slot; a given id of this table's
    /// own form (`{prefix}N`) moves the fresh ids past it, so they never collide with
    /// it later either.
    pub fn insert_with(
        &self,
        id: Option<String>,
        make: impl FnOnce(String) -> Arc<T>,
    ) -> ApiResult<Arc<T>> {
        let mut items = self.lock();
        let id = match id {
            Some(id) => {
                if items.contains_key(&id) {
                    return Err(ApiError::new(
                        ErrorCode::AlreadyExists,
                        format!("a {} with id {id} exists", self.what),
                    ));
                }
                if let Some(n) = id
                    .strip_prefix(self.prefix)
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    self.next.fetch_max(n.saturating_add(1), Ordering::Relaxed);
                }
                id
            }
            None => self.next_id(),
        };
        let item = make(id.clone());
        items.insert(id, item.clone());
        Ok(item)
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

    /// Every item, in creation order (ids not of the form `{prefix}N`, which only
    /// restored items have, last, by id).
    pub fn values(&self) -> Vec<Arc<T>> {
        let mut items: Vec<(u64, String, Arc<T>)> = self
            .lock()
            .iter()
            .map(|(id, item)| {
                let n = id
                    .strip_prefix(self.prefix)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(u64::MAX);
                (n, id.clone(), item.clone())
            })
            .collect();
        items.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        items.into_iter().map(|(_, _, item)| item).collect()
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

    #[test]
    fn given_ids_are_refused_when_taken_and_fresh_ids_move_past_them() {
        let r: Registry<u32> = Registry::new("x", "thing");
        let first = r.insert_with(None, |id| Arc::new(id.len() as u32)).unwrap();
        assert_eq!(*first, 2, "x1");
        r.insert_with(Some("x7".into()), |_| Arc::new(7)).unwrap();
        r.insert_with(Some("kept".into()), |_| Arc::new(0)).unwrap();
        let err = r
            .insert_with(Some("x7".into()), |_| Arc::new(0))
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::AlreadyExists);
        assert_eq!(err.message, "a thing with id x7 exists");
        assert_eq!(r.next_id(), "x8");
        // A smaller given id leaves the fresh ids where they are.
        r.insert_with(Some("x3".into()), |_| Arc::new(3)).unwrap();
        assert_eq!(r.next_id(), "x9");
        let values: Vec<u32> = r.values().iter().map(|v| **v).collect();
        assert_eq!(values, vec![2, 3, 7, 0]);
    }
}

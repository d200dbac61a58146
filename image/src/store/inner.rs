//! [`Inner`], what every clone of an `ImageStore` shares. Its methods live with the
//! part of the store they belong to: `pull`, `records`, `layout` and `sweep`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use tokio::sync::Semaphore;

use super::flight::Flights;
use super::usage::GcState;
use crate::config::StoreConfig;
use crate::registry::RegistryClient;
use crate::Image;

/// The store's state, behind the `Arc` of `ImageStore`. Only the store's own modules
/// see it; the layers above (`import`, `gc`) go through `ImageStore`'s methods.
pub(super) struct Inner {
    /// The store's root directory (absolute).
    pub(super) root: PathBuf,
    pub(super) config: StoreConfig,
    pub(super) registry: RegistryClient,
    /// Held while image records are written or removed, and through a gc scan.
    pub(super) records: Mutex<()>,
    /// Pin counts of `layers/<hex>` and `blobs/<hex>` keys.
    pub(super) pins: Mutex<HashMap<String, usize>>,
    /// Disk budget bookkeeping.
    pub(super) gc_state: GcState,
    /// Pulls running, by normalised name.
    pub(super) pulls: Flights<Image>,
    /// Layer downloads running, by digest.
    pub(super) layers: Flights<()>,
    /// Layer downloads at once, across all pulls.
    pub(super) downloads: Semaphore,
    /// Numbers the work paths under `tmp/`.
    pub(super) work_counter: AtomicU64,
}

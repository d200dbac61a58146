//! The defaults of `orchard serve` that are the configuration's own (the rest are the
//! service's, the listener's and the Kubernetes backend's, each written where it is
//! used): a leaf every part of `config` reads.

/// Address the server listens on unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
/// Log level unless told otherwise.
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// Sandboxes one key may hold at once unless the operator says otherwise: what one
/// machine holds (issue 30: with quotas off by default, one key could take it all).
pub const DEFAULT_MAX_SANDBOXES_PER_KEY: usize = 1024;
/// Creates one key may make per minute by default (a hundred a second: bursts pass,
/// a loop that creates forever is stopped).
pub const DEFAULT_CREATES_PER_MINUTE_PER_KEY: usize = 6000;
/// Bytes one key's snapshots may hold by default.
pub const DEFAULT_SNAPSHOT_BYTES_PER_KEY: u64 = 20 << 30;
/// What all keys' snapshots may hold together by default: half the data directory's
/// file system (issue 30: snapshot data lives on the host, outside `--sandbox-disk`,
/// and the per-key quota times the keys is no bound).
pub const DEFAULT_SNAPSHOT_BYTES_TOTAL: &str = "50%";
/// Free space a snapshot leaves on the data directory's file system by default (the
/// journals, spools and sandboxes' sparse disks need room too).
pub const DEFAULT_SNAPSHOT_MIN_FREE: &str = "5%";
/// Each sandbox's writable layer by default (`--sandbox-disk`): bounded, so one sandbox
/// cannot fill the host's disk; "0" or "none" turns the bound off.
pub const DEFAULT_SANDBOX_DISK: &str = "10Gi";
/// Files and directories each bounded sandbox disk may hold by default.
pub const DEFAULT_SANDBOX_DISK_INODES: u64 = 1 << 20;
/// Seconds between image GC passes by default.
pub const DEFAULT_IMAGE_GC_INTERVAL_S: u64 = 300;

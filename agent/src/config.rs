//! Agent configuration: where to listen, the token, and the limits with their defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use orchard_protocol::health::Limits;

/// Default largest JSON body: 16 MiB (stdin for an exec travels in it).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 16 << 20;
/// Default largest uploaded file or archive: 4 GiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 4 << 30;
/// Default commands running at once.
pub const DEFAULT_MAX_CONCURRENT_EXECS: u64 = 256;
/// Default per-stream output cap of a sync exec: 1 MiB (512 KiB head + 512 KiB tail).
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1 << 20;
/// Default largest per-stream cap a request may ask for: 256 MiB (the compatible
/// exec route asks for 64 MiB: Orchard does not truncate job output).
pub const DEFAULT_MAX_OUTPUT_CEILING_BYTES: u64 = 256 << 20;
/// Default ring buffer per stream of a background process: 1 MiB.
pub const DEFAULT_PROCESS_BUFFER_BYTES: u64 = 1 << 20;
/// Default command timeout: 10 minutes.
pub const DEFAULT_TIMEOUT_MS: u64 = 600_000;
/// Default retention of an exited background process: 10 minutes.
pub const DEFAULT_PROCESS_RETENTION_MS: u64 = 600_000;
/// Most background processes tracked at once (running or retained).
pub const MAX_TRACKED_PROCESSES: usize = 1024;

/// Everything the agent needs to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Unix socket path to listen on.
    pub unix: Option<PathBuf>,
    /// An inherited, listening Unix socket to serve on.
    pub listen_fd: Option<i32>,
    /// TCP address to listen on.
    pub tcp: Option<SocketAddr>,
    /// The sandbox token every request must carry.
    pub token: String,
    /// Limits in force.
    pub limits: Limits,
    /// Time between SIGTERM and SIGKILL when a command times out or the agent stops.
    pub kill_grace: Duration,
    /// After a command's leader exits, how long to keep reading pipes that a
    /// background grandchild still holds open.
    pub drain_after_exit: Duration,
    /// Interval of keepalive frames on a streamed exec.
    pub keepalive: Duration,
}

impl Config {
    /// A config with default limits and the given token, listening nowhere yet.
    pub fn new(token: impl Into<String>) -> Self {
        Self {
            unix: None,
            listen_fd: None,
            tcp: None,
            token: token.into(),
            limits: default_limits(),
            kill_grace: Duration::from_millis(500),
            drain_after_exit: Duration::from_millis(100),
            keepalive: Duration::from_secs(15),
        }
    }
}

/// The default limits.
pub fn default_limits() -> Limits {
    Limits {
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
        max_concurrent_execs: DEFAULT_MAX_CONCURRENT_EXECS,
        max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        max_output_ceiling_bytes: DEFAULT_MAX_OUTPUT_CEILING_BYTES,
        process_buffer_bytes: DEFAULT_PROCESS_BUFFER_BYTES,
        default_timeout_ms: DEFAULT_TIMEOUT_MS,
        process_retention_ms: DEFAULT_PROCESS_RETENTION_MS,
    }
}

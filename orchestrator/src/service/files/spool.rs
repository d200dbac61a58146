//! Upload spools and their bounds. The compatible file upload streams its body into a
//! file under `<data_dir>/spool`, then sends that file to the agent; until then the
//! bytes sit on the host, outside every sandbox's disk (issue 30: a stalled upload
//! kept up to 384 MiB spooled with no time-out, charged to no one). So:
//!
//! - **Per sandbox**: the spools of all uploads in flight to one sandbox together stay
//!   within the room on its disk ([`crate::backend::Backend::disk_room`]: what is free
//!   on the local backend's mounted image, a pod's ephemeral-storage limit, else
//!   [`UNBOUNDED_ROOM`]). An upload that would pass it is refused with 413 as soon as
//!   its spool does, or up front when its `Content-Length` says so.
//! - **On the host**: all spools together stay within `--upload-spool-bytes`; an upload
//!   that would pass it is refused with 503 (the others will end; retry), one that
//!   alone is larger with 413.
//! - **In time**: a body that sends nothing for the body time-out is cut by the
//!   listener (`TimeoutBody`), one that trickles is cut by [`Pace`]: every window of
//!   the body time-out must bring [`MIN_BYTES_PER_S`] a second. Both answer 408.
//!
//! A refused or cut upload's spool is removed at once (dropping the [`Spool`]), and its
//! charge given back.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::image::gc::Budget;
use crate::service::Error;

/// What a body must bring, on average over each window of the body time-out, for the
/// upload to go on: far below any real link (128 kbit/s), far above a trickle that
/// holds a spool for hours.
pub const MIN_BYTES_PER_S: u64 = 16 << 10;

/// The room of a sandbox whose disk is unbounded (or unknown): the upload route's own
/// bound on the decoded file, so concurrent uploads to it are summed against it.
pub const UNBOUNDED_ROOM: u64 = (super::MAX_UPLOAD_JSON as u64) / 4 * 3;

/// What a body of the upload route holds besides the base64 content, at most, when it
/// is the documented `{"path", "content"}`: the up-front check from `Content-Length`
/// takes the rest for content.
const BODY_OVERHEAD: u64 = 4096 + 64;

/// The default bound on all spools together (`--upload-spool-bytes`).
pub const DEFAULT_UPLOAD_SPOOL_BYTES: &str = "4Gi";

/// Why an upload's spool was refused or cut.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The sandbox's disk has no room for it, with the other uploads to it in flight.
    #[error(
        "the upload ({size} bytes so far) does not fit on sandbox {sandbox}'s disk: {room} bytes free, {others} of them taken by other uploads to it in flight"
    )]
    NoRoom {
        /// The sandbox.
        sandbox: String,
        /// Bytes of the file (spooled, or expected from `Content-Length`).
        size: u64,
        /// Bytes free on its disk when the upload began.
        room: u64,
        /// Bytes spooled for it by other uploads in flight.
        others: u64,
    },
    /// The upload alone is larger than all spools on the host may be.
    #[error(
        "the upload ({size} bytes so far) is larger than the server's upload spool ({limit} bytes)"
    )]
    LargerThanHost {
        /// Bytes of the file.
        size: u64,
        /// The bound on all spools.
        limit: u64,
    },
    /// All spools together are at the host's bound now.
    #[error(
        "the server's upload spool is full ({limit} bytes of uploads in flight); retry shortly"
    )]
    HostFull {
        /// The bound on all spools.
        limit: u64,
    },
    /// The body sent nothing for the body time-out.
    #[error("the upload sent nothing for {} s", .0.as_secs())]
    Stalled(Duration),
    /// The body sent too little in one window of the body time-out.
    #[error(
        "the upload sent {bytes} bytes in {} s, at least {min} are needed in that time",
        .window.as_secs()
    )]
    TooSlow {
        /// Bytes in the window.
        bytes: u64,
        /// The window.
        window: Duration,
        /// Bytes the window needed.
        min: u64,
    },
    /// The spool file could not be made.
    #[error("making the spool file: {0}")]
    Io(#[from] std::io::Error),
}

impl From<SpoolError> for Error {
    fn from(e: SpoolError) -> Error {
        match e {
            SpoolError::NoRoom { .. } | SpoolError::LargerThanHost { .. } => {
                Error::TooLarge(e.to_string())
            }
            SpoolError::HostFull { .. } => Error::Unavailable(e.to_string()),
            SpoolError::Stalled(_) | SpoolError::TooSlow { .. } => Error::Timeout(e.to_string()),
            SpoolError::Io(_) => Error::internal("cannot spool the upload", e),
        }
    }
}

/// The spools of one server: where they go, their bounds, what each sandbox holds.
pub struct Spools {
    dir: PathBuf,
    /// The bound on all spools together.
    host: Budget,
    /// The body time-out: the window of the progress rule.
    window: Duration,
    /// Bytes charged by the uploads in flight. Held only to check and add, or give
    /// back, one upload's bytes: checking and charging under one lock is what keeps
    /// two uploads from both seeing the room the other is about to take.
    charged: Mutex<Charged>,
}

#[derive(Default)]
struct Charged {
    per_sandbox: HashMap<String, u64>,
    total: u64,
}

impl Spools {
    /// Spools under `data_dir/spool`, all together within `host`, each body held to the
    /// progress rule over windows of `body_timeout`.
    pub fn new(data_dir: &std::path::Path, host: Budget, body_timeout: Duration) -> Spools {
        Spools {
            dir: data_dir.join("spool"),
            host,
            window: body_timeout,
            charged: Mutex::default(),
        }
    }

    /// A new, empty spool for an upload to `sandbox`, whose disk has `room` bytes
    /// (`None`: unbounded), with `declared` bytes of body if the client said. Refused up
    /// front when the body cannot fit.
    pub fn open(
        self: &Arc<Self>,
        sandbox: &str,
        room: Option<u64>,
        declared: Option<u64>,
    ) -> Result<Spool, SpoolError> {
        let room = room.unwrap_or(UNBOUNDED_ROOM);
        let host = self.host.bytes(self.parent());
        if let Some(body) = declared {
            let size = body.saturating_sub(BODY_OVERHEAD) / 4 * 3;
            let others = self.held_by(sandbox);
            if others.saturating_add(size) > room {
                return Err(SpoolError::NoRoom {
                    sandbox: sandbox.to_string(),
                    size,
                    room,
                    others,
                });
            }
            if let Some(limit) = host.filter(|l| size > *l) {
                return Err(SpoolError::LargerThanHost { size, limit });
            }
        }
        let path = self.make_file()?;
        Ok(Spool {
            path,
            spools: self.clone(),
            sandbox: sandbox.to_string(),
            room,
            host,
            charged: 0,
        })
    }

    /// The progress rule for a body starting now.
    pub fn pace(&self) -> Pace {
        Pace::new(self.window)
    }

    /// The body time-out (the window of the progress rule).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Bytes all uploads in flight hold spooled.
    pub fn total(&self) -> u64 {
        self.lock().total
    }

    fn held_by(&self, sandbox: &str) -> u64 {
        self.lock().per_sandbox.get(sandbox).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Charged> {
        self.charged.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The data directory (a percentage bound is of its file system).
    fn parent(&self) -> &std::path::Path {
        self.dir.parent().unwrap_or(&self.dir)
    }

    /// A private, empty file in the spool directory.
    fn make_file(&self) -> Result<PathBuf, SpoolError> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::create_dir_all(&self.dir)?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))?;
        let tag = crate::random::hex(8).map_err(|e| std::io::Error::other(e.to_string()))?;
        let path = self.dir.join(format!("upload-{tag}"));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok(path)
    }
}

/// One upload's spool file and its charge; dropping it removes the file and gives the
/// charge back, whichever way the upload ended.
pub struct Spool {
    path: PathBuf,
    spools: Arc<Spools>,
    sandbox: String,
    /// Bytes free on the sandbox's disk when the upload began.
    room: u64,
    /// The bound on all spools, when the upload began.
    host: Option<u64>,
    /// Bytes charged so far.
    charged: u64,
}

impl Spool {
    /// The file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Charges the spool up to `size` bytes: refused once it, with the other uploads
    /// in flight, passes the sandbox's room or the host's bound.
    pub fn charge_to(&mut self, size: u64) -> Result<(), SpoolError> {
        let Some(more) = size.checked_sub(self.charged).filter(|m| *m > 0) else {
            return Ok(());
        };
        let mut c = self.spools.lock();
        let others = c
            .per_sandbox
            .get(&self.sandbox)
            .copied()
            .unwrap_or(0)
            .saturating_sub(self.charged);
        if others.saturating_add(size) > self.room {
            return Err(SpoolError::NoRoom {
                sandbox: self.sandbox.clone(),
                size,
                room: self.room,
                others,
            });
        }
        if let Some(limit) = self.host {
            if size > limit {
                return Err(SpoolError::LargerThanHost { size, limit });
            }
            if c.total.saturating_add(more) > limit {
                return Err(SpoolError::HostFull { limit });
            }
        }
        *c.per_sandbox.entry(self.sandbox.clone()).or_insert(0) += more;
        c.total += more;
        self.charged = size;
        Ok(())
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let mut c = self.spools.lock();
        c.total = c.total.saturating_sub(self.charged);
        if let Some(n) = c.per_sandbox.get_mut(&self.sandbox) {
            *n = n.saturating_sub(self.charged);
            if *n == 0 {
                c.per_sandbox.remove(&self.sandbox);
            }
        }
    }
}

/// The progress rule of one body: each window (the body time-out) must bring
/// [`MIN_BYTES_PER_S`] a second. A window is judged when it ends, whether the body
/// was waited for then or a frame came after it.
pub struct Pace {
    window: Duration,
    min: u64,
    deadline: Instant,
    bytes: u64,
}

impl Pace {
    fn new(window: Duration) -> Pace {
        Pace::starting(window, Instant::now())
    }

    fn starting(window: Duration, now: Instant) -> Pace {
        Pace {
            window,
            min: (MIN_BYTES_PER_S as f64 * window.as_secs_f64()) as u64,
            deadline: now + window,
            bytes: 0,
        }
    }

    /// When the current window ends.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Counts `n` bytes of body, then judges the window if it is over.
    pub fn add(&mut self, n: usize) -> Result<(), SpoolError> {
        self.add_at(n, Instant::now())
    }

    /// Judges the window that just ended and starts the next.
    pub fn window_ended(&mut self) -> Result<(), SpoolError> {
        self.judge(Instant::now())
    }

    fn add_at(&mut self, n: usize, now: Instant) -> Result<(), SpoolError> {
        self.bytes += n as u64;
        if now >= self.deadline {
            return self.judge(now);
        }
        Ok(())
    }

    fn judge(&mut self, now: Instant) -> Result<(), SpoolError> {
        if self.bytes < self.min {
            return Err(SpoolError::TooSlow {
                bytes: self.bytes,
                window: self.window,
                min: self.min,
            });
        }
        self.bytes = 0;
        self.deadline = now + self.window;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spools(host: Budget) -> (tempfile::TempDir, Arc<Spools>) {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(Spools::new(dir.path(), host, Duration::from_secs(60)));
        (dir, s)
    }

    #[test]
    fn uploads_to_one_sandbox_are_summed_against_its_room_and_given_back() {
        let (_d, s) = spools(Budget::Off);
        let mut a = s.open("sb", Some(100), None).unwrap();
        let mut b = s.open("sb", Some(100), None).unwrap();
        let mut other = s.open("sb2", Some(100), None).unwrap();
        a.charge_to(60).unwrap();
        other.charge_to(90).unwrap();
        b.charge_to(40).unwrap();
        let e = b.charge_to(41).unwrap_err();
        assert!(
            matches!(
                e,
                SpoolError::NoRoom {
                    others: 60,
                    size: 41,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(Error::from(e).to_string().contains("sb's disk"));
        let path = a.path().to_path_buf();
        assert!(path.exists());
        drop(a);
        assert!(!path.exists(), "the spool goes with its upload");
        b.charge_to(100).unwrap();
        assert_eq!(s.total(), 190);
        drop((b, other));
        assert_eq!(s.total(), 0);
        assert!(s.lock().per_sandbox.is_empty());
    }

    #[test]
    fn the_host_bound_sums_every_upload_and_a_declared_length_is_checked_up_front() {
        let (_d, s) = spools(Budget::Bytes(100));
        let mut a = s.open("a", Some(1000), None).unwrap();
        let mut b = s.open("b", Some(1000), None).unwrap();
        a.charge_to(70).unwrap();
        let e = b.charge_to(31).unwrap_err();
        assert!(matches!(e, SpoolError::HostFull { limit: 100 }), "{e:?}");
        assert_eq!(crate::server::error::status(&e.into()), 503);
        let e = b.charge_to(101).unwrap_err();
        assert_eq!(
            crate::server::error::status(&e.into()),
            413,
            "alone too big"
        );
        drop(a);
        b.charge_to(100).unwrap();

        let declared = |json: u64| Some(json + BODY_OVERHEAD);
        let e = s.open("c", Some(1 << 20), declared(4 << 20)).err().unwrap();
        assert!(
            matches!(e, SpoolError::NoRoom { size, .. } if size == 3 << 20),
            "{e:?}"
        );
        let e = s.open("c", Some(1 << 30), declared(400)).err().unwrap();
        assert!(
            matches!(e, SpoolError::LargerThanHost { size: 300, .. }),
            "{e:?}"
        );
        assert!(s.open("c", Some(1 << 30), declared(132)).is_ok());
    }

    #[test]
    fn a_trickle_fails_its_window_and_a_steady_body_passes() {
        let window = Duration::from_secs(2);
        let start = Instant::now();
        let mut pace = Pace::starting(window, start);
        assert_eq!(pace.min, 32 << 10);
        pace.add_at(40 << 10, start).unwrap();
        pace.add_at(0, start + window).unwrap();
        assert_eq!(pace.deadline(), start + 2 * window, "the next window");
        pace.add_at(10, start + window).unwrap();
        let e = pace.add_at(10, start + 2 * window).unwrap_err();
        assert!(matches!(e, SpoolError::TooSlow { bytes: 20, .. }), "{e:?}");
        assert_eq!(crate::server::error::status(&e.into()), 408);
    }
}

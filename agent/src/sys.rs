//! Small safe wrappers over system facilities that several modules (and the
//! orchestrator's tests, through its dev-dependency on this crate) share: a new
//! pseudo-terminal pair, signal numbers as `rustix` signals, random ids, and unique
//! suffixes for temporary names.
//!
//! They sit on `rustix`, so the callers need no `unsafe` of their own.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{Mode, OFlags};
use rustix::process::Signal;
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

/// Opens a new pseudo-terminal of `rows` x `cols` and answers `(master, slave)`, both
/// close-on-exec (a child gets the slave only where it is handed over explicitly, as
/// its stdio) and neither becoming this process's controlling terminal. The one
/// `openpty` of the workspace: the agent's terminals and the CLI's terminal tests use it.
pub fn openpty(rows: u16, cols: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let size = Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(&slave, size)?;
    Ok((master, slave))
}

/// The signal numbered `number` (1 to 64, as `orchard_protocol::signal` accepts),
/// `None` for anything else.
pub fn signal(number: i32) -> Option<Signal> {
    if let Some(named) = Signal::from_named_raw(number) {
        return Some(named);
    }
    if !(1..=64).contains(&number) {
        return None;
    }
    // SAFETY: `number` is a real-time signal number the kernel accepts for kill(2).
    // rustix's caveat about signals the C library reserves concerns installing handlers
    // and masks in this process; here they are only ever sent, as `kill -N` would.
    Some(unsafe { Signal::from_raw_unchecked(number) })
}

/// `n` random bytes from the kernel's generator as lowercase hex.
pub fn random_hex(n: usize) -> Result<String, getrandom::Error> {
    random_hex_from(n, getrandom::fill)
}

/// `n` bytes from `fill` as hex; a failing `fill` is an error, never a short or zeroed id.
pub fn random_hex_from(
    n: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), getrandom::Error>,
) -> Result<String, getrandom::Error> {
    let mut bytes = vec![0u8; n];
    fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A short random-looking hex string for temporary names. It only has to make
/// collisions unlikely: every temporary name is created exclusively, so a collision is
/// a retry, never a clobber.
pub fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut x = nanos
        ^ u64::from(std::process::id()).rotate_left(32)
        ^ count.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finalizer, so consecutive calls do not share a prefix.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    format!("{x:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openpty_gives_a_sized_close_on_exec_pair() {
        let (master, slave) = openpty(33, 101).unwrap();
        assert!(rustix::termios::isatty(&slave));
        let size = rustix::termios::tcgetwinsize(&slave).unwrap();
        assert_eq!((size.ws_row, size.ws_col), (33, 101));
        for fd in [&master, &slave] {
            let flags = rustix::io::fcntl_getfd(fd).unwrap();
            assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        }
        rustix::io::write(&slave, b"x").unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(rustix::io::read(&master, &mut buf).unwrap(), 1);
    }

    #[test]
    fn signals_are_named_or_real_time_and_nothing_else() {
        assert_eq!(signal(9), Some(Signal::KILL));
        assert_eq!(signal(40).map(Signal::as_raw), Some(40));
        assert_eq!(signal(0), None);
        assert_eq!(signal(65), None);
    }

    #[test]
    fn random_hex_has_two_digits_a_byte_and_reports_a_failing_source() {
        assert_eq!(random_hex(12).unwrap().len(), 24);
        assert_ne!(random_hex(16).unwrap(), random_hex(16).unwrap());
        let failing = random_hex_from(8, |_| Err(getrandom::Error::UNSUPPORTED));
        assert!(failing.is_err());
    }

    #[test]
    fn unique_suffixes_differ() {
        let a = unique_suffix();
        let b = unique_suffix();
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
    }
}

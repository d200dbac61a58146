//! The local terminal: is a stream a TTY, its window size, and raw mode with a guard
//! that always puts the previous settings back.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};

use rustix::termios::{OptionalActions, Termios};

/// One of the process's standard streams, usable wherever a descriptor is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StdStream(RawFd);

impl AsFd for StdStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: descriptors 0, 1 and 2 stay open for the life of the process: nothing
        // in orchard closes them (the standard library's own handles rely on the same).
        unsafe { BorrowedFd::borrow_raw(self.0) }
    }
}

/// Standard input.
pub const STDIN: StdStream = StdStream(0);
/// Standard output.
pub const STDOUT: StdStream = StdStream(1);
/// Standard error.
pub const STDERR: StdStream = StdStream(2);

/// Whether `fd` is a terminal.
pub fn is_tty(fd: impl AsFd) -> bool {
    rustix::termios::isatty(fd)
}

/// `(rows, cols)` of the terminal on `fd`; `None` when it is not one or reports no size
/// (a pseudo-terminal nobody sized says 0x0).
pub fn window_size(fd: impl AsFd) -> Option<(u16, u16)> {
    let ws = rustix::termios::tcgetwinsize(fd).ok()?;
    (ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

/// The size of the terminal we run in: asked of stdin, then stdout, then stderr, since
/// any of them may be redirected.
pub fn local_size() -> Option<(u16, u16)> {
    [STDIN, STDOUT, STDERR].into_iter().find_map(window_size)
}

/// The terminal on `fd` in raw mode (no echo, no line editing, no signals from keys, no
/// output processing) until dropped, which restores the settings found at
/// [`RawMode::enter`]. Drop runs on every way out of the scope that holds the guard: a
/// return, `?`, or a panic unwinding through it.
pub struct RawMode<F: AsFd = StdStream> {
    fd: F,
    saved: Termios,
}

impl<F: AsFd> RawMode<F> {
    /// Switches `fd` to raw mode.
    pub fn enter(fd: F) -> io::Result<Self> {
        let saved = rustix::termios::tcgetattr(&fd)?;
        let mut raw = saved.clone();
        raw.make_raw();
        // Drain (TCSADRAIN): output already written (a prompt) is shown before the
        // switch, and typed-ahead input is kept (TCSAFLUSH would drop it).
        rustix::termios::tcsetattr(&fd, OptionalActions::Drain, &raw)?;
        Ok(Self { fd, saved })
    }
}

impl<F: AsFd> Drop for RawMode<F> {
    fn drop(&mut self) {
        // Nothing useful can be done when this fails (the terminal is gone).
        let _ = rustix::termios::tcsetattr(&self.fd, OptionalActions::Drain, &self.saved);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use rustix::termios::LocalModes;

    use super::*;

    /// A pseudo-terminal pair (master, slave), closed on drop.
    struct Pty(#[allow(dead_code)] OwnedFd, OwnedFd);

    impl Pty {
        fn open(rows: u16, cols: u16) -> Self {
            let (master, slave) = orchard_agent::sys::openpty(rows, cols).expect("openpty");
            Pty(master, slave)
        }

        fn lflag(&self) -> LocalModes {
            rustix::termios::tcgetattr(&self.1).unwrap().local_modes
        }
    }

    #[test]
    fn sizes_and_ttys_are_read_from_the_terminal() {
        let pty = Pty::open(33, 101);
        assert!(is_tty(&pty.1));
        assert_eq!(window_size(&pty.1), Some((33, 101)));
        let unsized_pty = Pty::open(0, 0);
        assert_eq!(window_size(&unsized_pty.1), None);
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(!is_tty(&file));
        assert_eq!(window_size(&file), None);
        assert!(RawMode::enter(&file).is_err());
    }

    #[test]
    fn raw_mode_is_undone_on_drop_and_on_panic() {
        let pty = Pty::open(24, 80);
        let cooked = pty.lflag();
        assert!(cooked.contains(LocalModes::ICANON));
        {
            let _raw = RawMode::enter(&pty.1).unwrap();
            assert!(!pty
                .lflag()
                .intersects(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG));
        }
        assert_eq!(pty.lflag(), cooked);

        let result = std::panic::catch_unwind(|| {
            let _raw = RawMode::enter(&pty.1).unwrap();
            panic!("a bug while the terminal is raw");
        });
        assert!(result.is_err());
        assert_eq!(pty.lflag(), cooked);
    }
}

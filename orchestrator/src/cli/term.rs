//! The local terminal: is a stream a TTY, its window size, and raw mode with a guard
//! that always puts the previous settings back.

use std::io;
use std::os::fd::RawFd;

/// Standard input.
pub const STDIN: RawFd = libc::STDIN_FILENO;
/// Standard output.
pub const STDOUT: RawFd = libc::STDOUT_FILENO;
/// Standard error.
pub const STDERR: RawFd = libc::STDERR_FILENO;

/// Whether `fd` is a terminal.
pub fn is_tty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// `(rows, cols)` of the terminal on `fd`; `None` when it is not one or reports no size
/// (a pseudo-terminal nobody sized says 0x0).
pub fn window_size(fd: RawFd) -> Option<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into memory we own.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
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
pub struct RawMode {
    fd: RawFd,
    saved: libc::termios,
}

impl RawMode {
    /// Switches `fd` to raw mode.
    pub fn enter(fd: RawFd) -> io::Result<Self> {
        // SAFETY: termios is plain data; zeroed is a valid value for tcgetattr to fill.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr fills `saved`, which we own.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw edits the struct we pass.
        unsafe { libc::cfmakeraw(&mut raw) };
        // TCSADRAIN: output already written (a prompt) is shown before the switch, and
        // typed-ahead input is kept (TCSAFLUSH would drop it).
        // SAFETY: tcsetattr reads `raw`, which we own.
        if unsafe { libc::tcsetattr(fd, libc::TCSADRAIN, &raw) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: tcsetattr reads the settings we saved. Nothing useful can be done when
        // it fails (the terminal is gone), so the result is ignored.
        unsafe {
            libc::tcsetattr(self.fd, libc::TCSADRAIN, &self.saved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pseudo-terminal pair (master, slave), closed on drop.
    struct Pty(RawFd, RawFd);

    impl Pty {
        fn open(rows: u16, cols: u16) -> Self {
            let (mut master, mut slave) = (-1, -1);
            let ws = libc::winsize {
                ws_row: rows,
                ws_col: cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            // SAFETY: openpty writes two fds; the name and termios pointers may be null.
            let rc = unsafe {
                libc::openpty(
                    &mut master,
                    &mut slave,
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    &ws,
                )
            };
            assert_eq!(rc, 0, "openpty: {}", io::Error::last_os_error());
            Pty(master, slave)
        }

        fn lflag(&self) -> libc::tcflag_t {
            // SAFETY: as in RawMode::enter.
            let mut t: libc::termios = unsafe { std::mem::zeroed() };
            // SAFETY: tcgetattr fills `t`.
            assert_eq!(unsafe { libc::tcgetattr(self.1, &mut t) }, 0);
            t.c_lflag
        }
    }

    impl Drop for Pty {
        fn drop(&mut self) {
            // SAFETY: closing fds this test opened.
            unsafe {
                libc::close(self.0);
                libc::close(self.1);
            }
        }
    }

    #[test]
    fn sizes_and_ttys_are_read_from_the_terminal() {
        let pty = Pty::open(33, 101);
        assert!(is_tty(pty.1));
        assert_eq!(window_size(pty.1), Some((33, 101)));
        let unsized_pty = Pty::open(0, 0);
        assert_eq!(window_size(unsized_pty.1), None);
        let file = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsRawFd;
        assert!(!is_tty(file.as_raw_fd()));
        assert_eq!(window_size(file.as_raw_fd()), None);
        assert!(RawMode::enter(file.as_raw_fd()).is_err());
    }

    #[test]
    fn raw_mode_is_undone_on_drop_and_on_panic() {
        let pty = Pty::open(24, 80);
        let cooked = pty.lflag();
        assert_ne!(cooked & libc::ICANON, 0);
        {
            let _raw = RawMode::enter(pty.1).unwrap();
            assert_eq!(pty.lflag() & (libc::ICANON | libc::ECHO | libc::ISIG), 0);
        }
        assert_eq!(pty.lflag(), cooked);

        let slave = pty.1;
        let result = std::panic::catch_unwind(move || {
            let _raw = RawMode::enter(slave).unwrap();
            panic!("a bug while the terminal is raw");
        });
        assert!(result.is_err());
        assert_eq!(pty.lflag(), cooked);
    }
}

//! Whether a test may run here, and saying so when it may not.
//!
//! The integration tests drive real runc sandboxes, which only root can create. Run as
//! another user, each such test prints one line to stderr and returns (passes), so
//! `cargo test` as a developer still passes and lists what it did not check. The line
//! is written to the process's stderr directly, not through `eprintln!`, because the
//! test harness captures (and, for a passing test, drops) what `eprintln!` prints.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Returns from the calling test, saying so, unless it runs as root with runc on PATH.
///
/// ```no_run
/// fn runs_in_a_sandbox() {
///     orchard_test_support::require_runc!();
///     // ... real runc sandboxes ...
/// }
/// ```
#[macro_export]
macro_rules! require_runc {
    () => {
        if $crate::skip_unless_root_and_runc() {
            return;
        }
    };
}

/// Returns from the calling test, saying so, unless it runs as root; the argument says
/// what root is needed for (`"chown and mknod"`).
#[macro_export]
macro_rules! require_root {
    ($why:expr) => {
        if $crate::skip_unless_root($why) {
            return;
        }
    };
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether `runc --version` runs, checked once per process.
fn runc_on_path() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        Command::new("runc")
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The running test's name: the test harness names each test's thread after it.
fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("this test")
        .to_string()
}

/// Prints `skipped: <test> needs <what>` where the test harness does not swallow it.
fn say_skipped(what: &str) {
    let line = format!("skipped: {} needs {what}\n", test_name());
    // Nothing to do if stderr is gone: the skip itself still holds.
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// True (and says so) when the calling test must skip because it does not run as
/// root; `why` says what root is needed for.
pub fn skip_unless_root(why: &str) -> bool {
    if is_root() {
        return false;
    }
    say_skipped(&format!("root ({why})"));
    true
}

/// True (and says so) when the calling test must skip because it does not run as root
/// or runc is not on PATH.
pub fn skip_unless_root_and_runc() -> bool {
    if is_root() && runc_on_path() {
        return false;
    }
    say_skipped("root and runc");
    true
}

//! The CLI for people, end to end: the real `orchard` binary against a real
//! `orchard serve` (its own process, its own data directory and key) running real runc
//! sandboxes. The busybox test image goes in through `orchard image import` itself.
//!
//! Nothing waits by sleeping: the server's ready file is watched with inotify, processes
//! are awaited through pidfds, and terminal output is awaited pattern by pattern with a
//! deadline.

mod snapshots;

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::registry::{image_layout, registry};
use crate::util::sandbox::agent_binary;

/// The key of every test server.
const KEY: &str = "cli-test-key";
/// Longest a CLI call, a server start or a stop may take.
const LIMIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Waiting on file descriptors, without sleeping.

/// A pidfd of `pid`: readable once the process has exited.
fn pidfd(pid: u32) -> OwnedFd {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    assert!(fd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// Waits until one of `fds` is readable or `deadline` passes; answers which are readable.
fn poll_readable(fds: &[RawFd], deadline: Instant) -> Vec<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfds: Vec<libc::pollfd> = fds
            .iter()
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: poll on an array we own, of the length we pass.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
        return pfds.iter().map(|p| p.revents != 0).collect();
    }
}

/// Waits for `child` until `deadline`; `None` when it is still running then.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    let fd = pidfd(child.id());
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    if poll_readable(&[fd.as_raw_fd()], deadline)[0] {
        return Some(child.wait().expect("waiting for a child"));
    }
    None
}

/// The shell's `$?` of a status: the code, or 128 + the signal.
fn code_of(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

// ---------------------------------------------------------------------------------------
// The server.

/// `orchard serve` on a loopback port and a temporary data directory; stopped with
/// SIGTERM (which deletes its sandboxes) on drop.
struct Server {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::Builder::new()
            .prefix("orchard-cli-")
            .tempdir()
            .expect("a temporary directory");
        let ready = dir.path().join("ready");
        // Watch before starting, so the write cannot be missed.
        // SAFETY: plain inotify calls; the fd is owned right after.
        let inotify = unsafe {
            let fd = libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK);
            assert!(
                fd >= 0,
                "inotify_init1: {}",
                std::io::Error::last_os_error()
            );
            OwnedFd::from_raw_fd(fd)
        };
        let dir_c = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes())
            .expect("a path without NUL");
        // SAFETY: a watch on a directory named by a valid C string.
        let wd = unsafe {
            libc::inotify_add_watch(
                inotify.as_raw_fd(),
                dir_c.as_ptr(),
                libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO,
            )
        };
        assert!(
            wd >= 0,
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        );
        let log = fs::File::create(dir.path().join("server.log")).expect("the server log");
        let child = Command::new(env!("CARGO_BIN_EXE_orchard"))
            .args(["serve", "--listen", "127.0.0.1:0", "--api-key", KEY])
            // The test registry listens on loopback.
            .args(["--allow-registry", "127.0.0.1"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--agent")
            .arg(agent_binary())
            .arg("--ready-file")
            .arg(&ready)
            .env_remove("ORCHARD_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting orchard serve");
        let mut server = Server {
            child,
            url: String::new(),
            dir,
        };
        let exited = pidfd(server.child.id());
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Ok(text) = fs::read_to_string(&ready) {
                if text.ends_with('\n') {
                    server.url = text.trim().to_string();
                    return server;
                }
            }
            let ready_fds = poll_readable(&[inotify.as_raw_fd(), exited.as_raw_fd()], deadline);
            if ready_fds[1] {
                panic!(
                    "orchard serve exited before it was ready:\n{}",
                    server.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "orchard serve was not ready in {LIMIT:?}:\n{}",
                server.log()
            );
            // Drain the events; the loop re-reads the file.
            let mut buf = [0u8; 4096];
            // SAFETY: read into a buffer we own from a non-blocking fd.
            unsafe { libc::read(inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// `orchard` with this server's URL and key in the environment, as a user has them.
    fn cli(&self, args: &[&str]) -> Command {
        self.cli_with_key(KEY, args)
    }

    fn cli_with_key(&self, key: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_orchard"));
        cmd.args(args)
            .env("SANDBOX_BASE_URL", &self.url)
            .env("SANDBOX_API_KEY", key);
        cmd
    }

    /// Imports the busybox test layout as `busybox:latest` through the CLI.
    fn import_busybox(&self) {
        let layout = image_layout("busybox");
        let out = run(self.cli(&[
            "image",
            "import",
            path_str(&layout),
            "--name",
            "busybox:latest",
        ]));
        assert_eq!(out.code, 0, "{out:?}");
        assert!(
            out.stdout
                .starts_with("docker.io/library/busybox:latest sha256:"),
            "{out:?}"
        );
    }

    /// A ready busybox sandbox; answers its id.
    fn sandbox(&self) -> String {
        let out = run(self.cli(&["sandbox", "create", "busybox:latest"]));
        assert_eq!(out.code, 0, "{out:?}\n{}", self.log());
        let id = out.stdout.trim().to_string();
        assert!(
            !id.is_empty() && !id.contains(char::is_whitespace),
            "{out:?}"
        );
        id
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        if wait_until(&mut self.child, Instant::now() + LIMIT).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            eprintln!("orchard serve ignored SIGTERM:\n{}", self.log());
        }
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

// ---------------------------------------------------------------------------------------
// Running the CLI.

/// What a CLI run left.
#[derive(Debug)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` with no stdin.
fn run(cmd: Command) -> Out {
    run_with_stdin(cmd, None)
}

/// Runs `cmd` to its end (at most [`LIMIT`]), feeding `stdin` when given.
fn run_with_stdin(mut cmd: Command, stdin: Option<&[u8]>) -> Out {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting orchard");
    if let Some(data) = stdin {
        let mut pipe = child.stdin.take().expect("stdin pipe");
        let data = data.to_vec();
        // A thread: the child may not read it all before it answers.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
    }
    let stdout = reader(child.stdout.take().expect("stdout pipe"));
    let stderr = reader(child.stderr.take().expect("stderr pipe"));
    let Some(status) = wait_until(&mut child, Instant::now() + LIMIT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{cmd:?} did not finish in {LIMIT:?}");
    };
    Out {
        code: code_of(status),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = r.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    })
}

// ---------------------------------------------------------------------------------------
// A pseudo-terminal for the CLI to run in.

/// The master side of a terminal whose slave is the CLI's stdin, stdout, stderr and
/// controlling terminal. Everything the CLI writes is collected in `output`.
struct Terminal {
    master: Arc<OwnedFd>,
    /// Kept to check the CLI restored the terminal settings; dropped before the end so
    /// the reader sees the terminal hang up.
    slave: Option<OwnedFd>,
    output: Arc<(Mutex<Vec<u8>>, Condvar)>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Terminal {
    fn open(rows: u16, cols: u16) -> Terminal {
        let (master, slave) = orchard_agent::sys::openpty(rows, cols).expect("openpty");
        let master = Arc::new(master);
        let output: Arc<(Mutex<Vec<u8>>, Condvar)> = Arc::default();
        let (m, out) = (master.clone(), output.clone());
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                // EIO once no slave is open.
                let n = match rustix::io::read(&*m, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => break,
                };
                let (lock, cv) = &*out;
                lock.lock().unwrap().extend_from_slice(&buf[..n]);
                cv.notify_all();
            }
        });
        Terminal {
            master,
            slave: Some(slave),
            output,
            reader: Some(reader),
        }
    }

    /// Starts `cmd` on this terminal as a session leader with it as the controlling
    /// terminal (so a resize sends it SIGWINCH, as a real terminal would).
    fn spawn(&self, mut cmd: Command) -> Child {
        let slave = self.slave.as_ref().expect("the slave").as_raw_fd();
        let stdio = || {
            // SAFETY: dup of an fd we own.
            let fd = unsafe { libc::dup(slave) };
            assert!(fd >= 0);
            // SAFETY: fresh fd, owned by the Stdio.
            unsafe { Stdio::from(OwnedFd::from_raw_fd(fd)) }
        };
        cmd.stdin(stdio()).stdout(stdio()).stderr(stdio());
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().expect("starting orchard on the terminal")
    }

    /// Types `text`.
    fn type_text(&self, text: &str) {
        let mut rest = text.as_bytes();
        while !rest.is_empty() {
            // SAFETY: write from a live slice.
            let n =
                unsafe { libc::write(self.master.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
            assert!(
                n > 0,
                "writing to the terminal: {}",
                std::io::Error::last_os_error()
            );
            rest = &rest[n as usize..];
        }
    }

    /// Resizes the window (the kernel signals SIGWINCH to the foreground job).
    fn resize(&self, rows: u16, cols: u16) {
        let ws = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize we own.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    }

    /// Waits until the output after byte `from` contains `needle`; answers the offset
    /// just after it.
    fn wait_for(&self, needle: &str, from: usize) -> usize {
        let deadline = Instant::now() + LIMIT;
        let (lock, cv) = &*self.output;
        let mut out = lock.lock().unwrap();
        loop {
            let tail = &out[from.min(out.len())..];
            if let Some(pos) = tail
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
            {
                return from + pos + needle.len();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{needle:?} never appeared; the terminal shows:\n{}",
                String::from_utf8_lossy(&out)
            );
            out = cv.wait_timeout(out, left).unwrap().0;
        }
    }

    /// The local-mode flags of the terminal now.
    fn lflag(&self) -> libc::tcflag_t {
        let fd = self.slave.as_ref().expect("the slave").as_raw_fd();
        // SAFETY: termios is plain data, filled by tcgetattr.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::tcgetattr(fd, &mut t) }, 0);
        t.c_lflag
    }

    /// Everything the CLI wrote, once it and every copy of the slave are gone.
    fn finish(mut self) -> String {
        self.slave = None;
        if let Some(r) = self.reader.take() {
            r.join().expect("the terminal reader");
        }
        let out = self.output.0.lock().unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }
}

// ---------------------------------------------------------------------------------------
// The tests.

#[test]
fn sandboxes_are_created_listed_used_and_removed() {
    orchard_test_support::require_runc!();
    let server = Server::start();
    server.import_busybox();

    let out = run(server.cli(&[
        "sandbox",
        "create",
        "busybox:latest",
        "--label",
        "team=rl",
        "--env",
        "FROM_CREATE=yes",
        "--json",
    ]));
    assert_eq!(out.code, 0, "{out:?}\n{}", server.log());
    let created: Value = serde_json::from_str(&out.stdout).expect("create --json prints JSON");
    let labelled = created["id"].as_str().expect("an id").to_string();
    assert_eq!(created["labels"]["team"], "rl", "{created}");
    assert_eq!(created["status"], "running", "{created}");
    let plain = server.sandbox();

    let out = run(server.cli(&["sandbox", "ls"]));
    assert_eq!(out.code, 0, "{out:?}");
    let mut lines = out.stdout.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["ID", "IMAGE", "STATUS", "AGE"], "{out:?}");
    for id in [&labelled, &plain] {
        let row = out
            .stdout
            .lines()
            .find(|l| l.starts_with(id.as_str()))
            .unwrap_or_else(|| panic!("{id} is not listed: {out:?}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells.len(), 4, "{row}");
        assert!(cells[1].contains("busybox"), "{row}");
        assert_eq!(cells[2], "running", "{row}");
        assert!(cells[3].ends_with('s') || cells[3].ends_with('m'), "{row}");
    }
    let out = run(server.cli(&["sandbox", "ls", "--json"]));
    let listed: Value = serde_json::from_str(&out.stdout).expect("ls --json prints JSON");
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");

    // Output goes to the right stream and the exit code comes through.
    let out = run(server.cli(&[
        "sandbox",
        "exec",
        &plain,
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]));
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (7, "out\n", "err\n")
    );
    // Options, and the environment given at creation.
    let out = run(server.cli(&[
        "sandbox",
        "exec",
        &labelled,
        "--cwd",
        "/tmp",
        "--env",
        "GREETING=hi",
        "--",
        "sh",
        "-c",
        "echo $GREETING $FROM_CREATE; pwd",
    ]));
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "hi yes\n/tmp\n"),
        "{out:?}"
    );
    // A shell string, and stdin.
    let out = run(server.cli(&["sandbox", "exec", &plain, "--sh", "echo", "$((6*7))"]));
    assert_eq!((out.code, out.stdout.as_str()), (0, "42\n"), "{out:?}");
    let out = run_with_stdin(
        server.cli(&["sandbox", "exec", &plain, "-i", "--", "wc", "-c"]),
        Some(b"abcde"),
    );
    assert_eq!((out.code, out.stdout.trim()), (0, "5"), "{out:?}");
    // Killed by a signal: 128 + the signal, as a shell reports it.
    let out = run(server.cli(&["sandbox", "exec", &plain, "--", "sh", "-c", "kill -9 $$"]));
    assert_eq!(out.code, 137, "{out:?}");
    // Out of time.
    let out = run(server.cli(&[
        "sandbox",
        "exec",
        &plain,
        "--timeout",
        "1",
        "--",
        "sleep",
        "60",
    ]));
    assert!(out.code == 143 || out.code == 137, "{out:?}");
    assert!(out.stderr.contains("ran out of time"), "{out:?}");
    // A program that does not exist: the server's reason, not a stack.
    let out = run(server.cli(&["sandbox", "exec", &plain, "--", "/no/such/program"]));
    assert_ne!(out.code, 0, "{out:?}");
    assert!(out.stderr.starts_with("orchard: "), "{out:?}");

    let out = run(server.cli(&["sandbox", "rm", &labelled, &plain]));
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, format!("{labelled}\n{plain}\n"));
    let out = run(server.cli(&["sandbox", "ls"]));
    assert_eq!(
        out.stdout.lines().count(),
        1,
        "only the header is left: {out:?}"
    );
    let out = run(server.cli(&["sandbox", "rm", &plain]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with(&format!("orchard: {plain}: 404: ")),
        "{out:?}"
    );
    let out = run(server.cli(&["sandbox", "exec", &plain, "--", "true"]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("orchard: 404: "), "{out:?}");
}

#[test]
fn exec_output_is_streamed_while_the_command_runs() {
    orchard_test_support::require_runc!();
    let server = Server::start();
    server.import_busybox();
    let id = server.sandbox();
    // The command cannot end before /tmp/go exists, which the test makes only after it
    // has read the first line: that line was streamed, not buffered to the end.
    let mut child = server
        .cli(&[
            "sandbox",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo ready; until [ -e /tmp/go ]; do sleep 0.05; done; echo done",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting orchard");
    let mut stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut seen = Vec::new();
    while !seen.ends_with(b"ready\n") {
        seen.extend(rx.recv_timeout(LIMIT).expect("the first line in time"));
    }
    assert_eq!(seen, b"ready\n");
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "it ended early"
    );

    let out = run(server.cli(&["sandbox", "exec", &id, "--", "touch", "/tmp/go"]));
    assert_eq!(out.code, 0, "{out:?}");
    let status = wait_until(&mut child, Instant::now() + LIMIT).expect("exec ended");
    assert_eq!(code_of(status), 0);
    while let Ok(chunk) = rx.recv_timeout(LIMIT) {
        seen.extend(chunk);
    }
    assert_eq!(String::from_utf8_lossy(&seen), "ready\ndone\n");
}

#[test]
fn images_are_imported_listed_and_removed() {
    orchard_test_support::require_runc!();
    let server = Server::start();
    // A directory (tarred on the fly by the CLI) ...
    server.import_busybox();
    // ... and an archive file uploaded as it is.
    let layout = image_layout("busybox");
    let archive = server.dir.path().join("busybox.tar.gz");
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-czf")
        .arg(&archive)
        .arg(".")
        .status()
        .expect("running tar");
    assert!(tar.success());
    let out = run(server.cli(&[
        "image",
        "import",
        path_str(&archive),
        "--name",
        "busybox:gz",
    ]));
    assert_eq!(out.code, 0, "{out:?}\n{}", server.log());
    assert!(
        out.stdout
            .starts_with("docker.io/library/busybox:gz sha256:"),
        "{out:?}"
    );
    // Upload progress went to stderr (plain lines: stderr is a pipe here).
    assert!(!out.stderr.contains('\r'), "{out:?}");

    let out = run(server.cli(&["image", "ls"]));
    assert_eq!(out.code, 0, "{out:?}");
    let header: Vec<&str> = out
        .stdout
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["REFERENCE", "DIGEST", "LAYERS", "SIZE"], "{out:?}");
    for name in [
        "docker.io/library/busybox:latest",
        "docker.io/library/busybox:gz",
    ] {
        let row = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} is not listed: {out:?}"));
        assert!(row.contains("sha256:"), "{row}");
    }
    let out = run(server.cli(&["image", "ls", "--json"]));
    let images: Value = serde_json::from_str(&out.stdout).expect("ls --json prints JSON");
    let images = images.as_array().expect("an array").clone();
    assert_eq!(images.len(), 2, "{images:?}");
    // The same content both ways: the same image.
    assert_eq!(images[0]["digest"], images[1]["digest"], "{images:?}");

    let out = run(server.cli(&["image", "rm", "busybox:gz"]));
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "busybox:gz\n"),
        "{out:?}"
    );
    let out = run(server.cli(&["image", "ls"]));
    assert!(!out.stdout.contains("busybox:gz"), "{out:?}");
    assert!(out.stdout.contains("busybox:latest"), "{out:?}");
    let out = run(server.cli(&["image", "rm", "nope:1"]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("orchard: nope:1: 404: "), "{out:?}");

    // Not an image at all.
    let junk = server.dir.path().join("junk.tar");
    fs::write(&junk, b"not a tar").unwrap();
    let out = run(server.cli(&["image", "import", path_str(&junk)]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("orchard: 4"), "{out:?}");
    let out = run(server.cli(&["image", "import", path_str(server.dir.path())]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("not an OCI image layout"), "{out:?}");
}

#[test]
fn images_are_pulled_with_progress() {
    orchard_test_support::require_runc!();
    registry().push_image("busybox", "latest", "cli/busybox:latest");
    let reference = format!("{}/cli/busybox:latest", registry().host);
    let server = Server::start();

    // stderr a pipe: plain lines, one per completed layer.
    let out = run(server.cli(&["image", "pull", &reference]));
    assert_eq!(out.code, 0, "{out:?}\n{}", server.log());
    let (name, digest) = out.stdout.trim().split_once(' ').expect("REFERENCE DIGEST");
    assert_eq!(name, reference, "{out:?}");
    assert!(digest.starts_with("sha256:"), "{out:?}");
    assert!(!out.stderr.contains('\r'), "{out:?}");
    assert!(out.stderr.contains(" layers, "), "{out:?}");

    // stderr a terminal: a bar redrawn in place, erased at the end.
    let out = run(server.cli(&["image", "rm", &reference]));
    assert_eq!(out.code, 0, "{out:?}");
    let term = Terminal::open(24, 100);
    let mut child = {
        // In this block: the Command holds its copy of the terminal until dropped.
        let mut cmd = server.cli(&["image", "pull", &reference]);
        cmd.stdin(Stdio::null());
        let slave = term.slave.as_ref().expect("the slave").as_raw_fd();
        // SAFETY: dup of an fd we own, handed to the child's stderr.
        let fd = unsafe { libc::dup(slave) };
        assert!(fd >= 0);
        // SAFETY: fresh fd.
        cmd.stderr(unsafe { Stdio::from(OwnedFd::from_raw_fd(fd)) })
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting orchard")
    };
    let stdout = reader(child.stdout.take().expect("stdout"));
    let status = wait_until(&mut child, Instant::now() + LIMIT).expect("pull ended");
    assert_eq!(code_of(status), 0);
    assert!(stdout.join().unwrap().starts_with(&reference));
    let shown = term.finish();
    assert!(shown.contains("\r\x1b[2K"), "{shown:?}");
    assert!(shown.contains(" layers "), "{shown:?}");
    assert!(shown.ends_with("\r\x1b[2K"), "the bar is erased: {shown:?}");

    let out = run(server.cli(&[
        "image",
        "pull",
        &format!("{}/cli/missing:1", registry().host),
    ]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("orchard: "), "{out:?}");
}

#[test]
fn shell_is_an_interactive_terminal() {
    orchard_test_support::require_runc!();
    let server = Server::start();
    server.import_busybox();
    let id = server.sandbox();

    let term = Terminal::open(30, 100);
    let cooked = term.lflag();
    let mut child = term.spawn(server.cli(&["sandbox", "shell", &id]));
    // The remote terminal starts at our size.
    term.type_text("stty size\n");
    let at = term.wait_for("30 100", 0);
    // Keys go through raw (the local terminal does not interpret them) and come back.
    term.type_text("echo $((6*7))\n");
    let at = term.wait_for("42\r\n", at);
    // A resize reaches the sandbox.
    term.resize(50, 132);
    term.type_text("stty size\n");
    let _ = term.wait_for("50 132", at);
    term.type_text("exit 3\n");
    let status = wait_until(&mut child, Instant::now() + LIMIT).expect("the shell ended");
    assert_eq!(code_of(status), 3);
    // The local terminal is as it was.
    assert_eq!(term.lflag(), cooked);
    term.finish();

    // Ended from outside (SIGTERM): the terminal is restored all the same, and the
    // remote one closed.
    let term = Terminal::open(24, 80);
    let mut child = term.spawn(server.cli(&["sandbox", "shell", &id]));
    term.type_text("echo $((7*6))-up\n");
    let _ = term.wait_for("42-up\r\n", 0);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = wait_until(&mut child, Instant::now() + LIMIT).expect("the shell ended");
    assert_eq!(code_of(status), 128 + libc::SIGTERM);
    assert_eq!(term.lflag(), cooked);
    term.finish();
    assert_no_terminals(&server, &id);
}

/// Every session closed its remote terminal (the agent keeps exited ones otherwise, and
/// caps how many there are).
fn assert_no_terminals(server: &Server, id: &str) {
    let (status, body) = http_get(server, &format!("/v1/sandboxes/{id}/pty"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ptys"], serde_json::json!([]), "{body}");
}

/// A GET with the key, by hand over HTTP/1.1 (the tests have no blocking client);
/// answers the status and the JSON body.
fn http_get(server: &Server, path: &str) -> (u16, Value) {
    let authority = server.url.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(authority).expect("connecting to the server");
    conn.set_read_timeout(Some(LIMIT)).expect("a read timeout");
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nX-API-Key: {KEY}\r\nConnection: close\r\n\r\n"
    )
    .expect("sending the request");
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .expect("reading the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a header and a body");
    assert!(!head.to_ascii_lowercase().contains("chunked"), "{head}");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[test]
fn shell_works_without_a_terminal() {
    orchard_test_support::require_runc!();
    let server = Server::start();
    server.import_busybox();
    let id = server.sandbox();

    let out = run_with_stdin(
        server.cli(&["sandbox", "shell", &id]),
        Some(b"echo hi-$((1+1))\nexit 5\n"),
    );
    assert_eq!(out.code, 5, "{out:?}");
    assert!(out.stdout.contains("hi-2"), "{out:?}");
    // The end of stdin ends the shell (Ctrl-D reaches it), whether the shell had
    // switched its terminal to raw mode by then or not: a few times, as that is a race.
    for _ in 0..10 {
        let out = run_with_stdin(server.cli(&["sandbox", "shell", &id]), Some(b"echo bye\n"));
        assert_eq!(out.code, 0, "{out:?}");
        assert!(out.stdout.contains("bye"), "{out:?}");
        assert_eq!(out.stderr, "", "{out:?}");
    }
    // A program instead of the shell.
    let out = run(server.cli(&[
        "sandbox",
        "shell",
        &id,
        "--",
        "sh",
        "-c",
        "echo prog; exit 4",
    ]));
    assert_eq!(out.code, 4, "{out:?}");
    assert!(out.stdout.contains("prog"), "{out:?}");
    assert_no_terminals(&server, &id);
    let out = run(server.cli(&["sandbox", "shell", "no-such-sandbox"]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("orchard: 404: "), "{out:?}");
}

#[test]
fn bad_usage_is_explained() {
    orchard_test_support::require_runc!();
    // No server: a port that was just free.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    for args in [
        &["sandbox", "ls"][..],
        &["image", "ls"],
        &["sandbox", "shell", "x"],
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_orchard"));
        cmd.args(args)
            .env("SANDBOX_BASE_URL", &url)
            .env_remove("SANDBOX_API_KEY");
        let out = run(cmd);
        assert_eq!(out.code, 1, "{out:?}");
        assert!(
            out.stderr
                .starts_with(&format!("orchard: cannot reach the server at {url}: ")),
            "{out:?}"
        );
        assert!(out.stderr.contains("refused"), "{out:?}");
    }
    // --url wins over the environment.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orchard"));
    cmd.args(["sandbox", "ls", "--url", &url])
        .env("SANDBOX_BASE_URL", "http://127.0.0.1:1");
    let out = run(cmd);
    assert!(out.stderr.contains(&url), "{out:?}");

    let server = Server::start();
    // A wrong key, and none: the server's 401 and its reason.
    let out = run(server.cli_with_key("wrong-key", &["sandbox", "ls"]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("orchard: 401: "), "{out:?}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orchard"));
    cmd.args(["image", "ls"])
        .env("SANDBOX_BASE_URL", &server.url)
        .env_remove("SANDBOX_API_KEY");
    let out = run(cmd);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("orchard: 401: "), "{out:?}");
    let out = run(server.cli_with_key("wrong-key", &["sandbox", "shell", "x"]));
    assert!(out.stderr.starts_with("orchard: 401: "), "{out:?}");
    // Usage errors are clap's (exit 2), before any request.
    let out = run(server.cli(&["sandbox", "create", "busybox", "--label", "novalue"]));
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("is not KEY=VALUE"), "{out:?}");
    let out = run(server.cli(&["sandbox", "exec", "x"]));
    assert_eq!(out.code, 2, "{out:?}");
    let out = run(server.cli(&["sandbox", "ls", "--url", "not a url"]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("orchard: invalid server URL"),
        "{out:?}"
    );
}

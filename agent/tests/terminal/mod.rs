//! Terminals and sessions in a real sandbox: resize, a full-screen program, re-attach
//! with scrollback, several viewers, signals to the foreground process, the compatible
//! protocol, the idle timeout, and a thousand session commands without growth.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use orchard_protocol::output::{b64_decode, b64_encode};
use orchard_protocol::pty::{PtyCreate, PtyServerFrame};
use orchard_protocol::session::{SessionCreate, SessionRun};
use orchard_protocol::Command;
use serde_json::json;
use tokio::net::UnixStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::util::*;

/// How long any one expected piece of terminal output may take.
const SCREEN_LIMIT: Duration = Duration::from_secs(10);

/// One WebSocket viewer of a terminal.
struct Term {
    ws: WebSocketStream<UnixStream>,
    /// Every output byte received so far (replay included).
    screen: Vec<u8>,
    /// Set once the exit frame arrived.
    exit: Option<(Option<i32>, Option<i32>)>,
}

async fn connect(sb: &Sandbox, path: &str) -> WebSocketStream<UnixStream> {
    let mut req = format!("ws://agent{path}").into_client_request().unwrap();
    req.headers_mut()
        .insert("x-orchard-token", sb.token.parse().unwrap());
    let stream = UnixStream::connect(&sb.socket).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(req, stream)
        .await
        .unwrap_or_else(|e| panic!("websocket {path}: {e}"));
    ws
}

impl Term {
    async fn attach(sb: &Sandbox, id: &str) -> Term {
        let ws = connect(sb, &format!("/v1/pty/{id}/attach")).await;
        let mut term = Term {
            ws,
            screen: Vec::new(),
            exit: None,
        };
        match term.frame().await {
            Some(PtyServerFrame::Attached { pty }) => assert_eq!(pty.id, id),
            other => panic!("expected an attached frame, got {other:?}"),
        }
        term
    }

    async fn send(&mut self, frame: serde_json::Value) {
        self.ws
            .send(Message::Text(frame.to_string().into()))
            .await
            .unwrap();
    }

    async fn type_text(&mut self, text: &str) {
        self.send(json!({"type": "stdin", "data": b64_encode(text.as_bytes())}))
            .await;
    }

    /// The next frame, recording output and exit; `None` when the socket closed.
    async fn frame(&mut self) -> Option<PtyServerFrame> {
        loop {
            let msg = tokio::time::timeout(SCREEN_LIMIT, self.ws.next())
                .await
                .expect("no frame from the terminal in time")?;
            let Ok(Message::Text(text)) = msg else {
                if matches!(msg, Ok(Message::Close(_)) | Err(_)) {
                    return None;
                }
                continue;
            };
            let frame: PtyServerFrame = serde_json::from_str(&text).unwrap();
            match &frame {
                PtyServerFrame::Output { data, .. } => {
                    self.screen.extend(b64_decode(data).unwrap());
                }
                PtyServerFrame::Exit { code, signal } => self.exit = Some((*code, *signal)),
                _ => {}
            }
            return Some(frame);
        }
    }

    /// Reads until the screen (from `from` on) contains `needle`.
    async fn wait_for(&mut self, from: usize, needle: &str) {
        let deadline = Instant::now() + SCREEN_LIMIT;
        while !contains(
            &self.screen[from.min(self.screen.len())..],
            needle.as_bytes(),
        ) {
            assert!(
                Instant::now() < deadline,
                "terminal never showed {needle:?}; screen: {:?}",
                String::from_utf8_lossy(&self.screen)
            );
            if self.frame().await.is_none() {
                panic!(
                    "terminal closed before showing {needle:?}; screen: {:?}",
                    String::from_utf8_lossy(&self.screen)
                );
            }
        }
    }

    async fn wait_exit(&mut self) -> (Option<i32>, Option<i32>) {
        while self.exit.is_none() {
            if self.frame().await.is_none() {
                break;
            }
        }
        self.exit
            .expect("the terminal closed without an exit frame")
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

async fn open(sb: &Sandbox, command: Option<Command>, rows: u16, cols: u16) -> String {
    let req = PtyCreate {
        command,
        rows: Some(rows),
        cols: Some(cols),
        ..Default::default()
    };
    sb.client().create_pty(&req).await.unwrap().id
}

fn sh() -> Option<Command> {
    Some(Command::Argv(vec!["/bin/sh".into()]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_stty_size_follows_resizes_from_the_socket_and_the_route() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let id = open(&sb, sh(), 24, 80).await;
    let mut t = Term::attach(&sb, &id).await;
    let mark = t.screen.len();
    t.type_text("stty size\n").await;
    t.wait_for(mark, "24 80").await;

    t.send(json!({"type": "resize", "rows": 40, "cols": 120}))
        .await;
    let mark = t.screen.len();
    t.type_text("stty size\n").await;
    t.wait_for(mark, "40 120").await;

    let info = sb.client().resize_pty(&id, 33, 99).await.unwrap();
    assert_eq!((info.rows, info.cols), (33, 99));
    let mark = t.screen.len();
    t.type_text("stty size\n").await;
    t.wait_for(mark, "33 99").await;
    sb.client().delete_pty(&id).await.unwrap();
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_runs_a_full_screen_editor() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let id = open(
        &sb,
        Some(Command::Argv(vec!["vi".into(), "/tmp/note.txt".into()])),
        24,
        80,
    )
    .await;
    let mut t = Term::attach(&sb, &id).await;
    // vi paints the empty buffer as a column of `~` with cursor addressing.
    let deadline = Instant::now() + SCREEN_LIMIT;
    while t.screen.iter().filter(|b| **b == b'~').count() < 20 || !contains(&t.screen, b"\x1b[") {
        assert!(
            Instant::now() < deadline,
            "vi never drew its screen: {:?}",
            String::from_utf8_lossy(&t.screen)
        );
        t.frame().await.expect("terminal closed");
    }
    t.type_text("ihello from vi\x1b").await;
    t.wait_for(0, "hello from vi").await;
    t.type_text(":wq\r").await;
    assert_eq!(t.wait_exit().await, (Some(0), None));
    let saved = sb.client().read_file("/tmp/note.txt").await.unwrap();
    assert_eq!(&saved[..], b"hello from vi\n");
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_reattach_replays_scrollback_and_viewers_share_the_terminal() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let id = open(&sb, sh(), 24, 80).await;
    let mut first = Term::attach(&sb, &id).await;
    first.type_text("echo one-$((40+2))\n").await;
    first.wait_for(0, "one-42").await;
    first.send(json!({"type": "detach"})).await;
    while first.frame().await.is_some() {}
    let info = sb.client().pty(&id).await.unwrap();
    assert!(info.alive, "detaching must not end the terminal");

    let mut again = Term::attach(&sb, &id).await;
    match again.frame().await {
        Some(PtyServerFrame::Output { replay: true, .. }) => {}
        other => panic!("expected the scrollback replay, got {other:?}"),
    }
    assert!(
        contains(&again.screen, b"one-42"),
        "replay lacks earlier output"
    );

    // A second viewer sees what the first types, live.
    let mut other = Term::attach(&sb, &id).await;
    let (mark_a, mark_b) = (again.screen.len(), other.screen.len() + 1);
    again.type_text("echo two-$((1+1))\n").await;
    again.wait_for(mark_a, "two-2").await;
    other.wait_for(mark_b.saturating_sub(1), "two-2").await;
    assert_eq!(sb.client().pty(&id).await.unwrap().viewers, 2);

    again.send(json!({"type": "close"})).await;
    let (code, signal) = again.wait_exit().await;
    assert!(code.is_some() || signal.is_some());
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_signal_int_reaches_the_foreground_process() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let id = open(&sb, sh(), 24, 80).await;
    let mut t = Term::attach(&sb, &id).await;
    // One command per line: an interactive shell drops the rest of a line whose
    // foreground job was interrupted.
    t.type_text("sleep 1000\n").await;
    // Wait until sleep really is the running foreground program.
    let deadline = Instant::now() + SCREEN_LIMIT;
    while sb.sh("pidof sleep").await.exit_code != Some(0) {
        assert!(Instant::now() < deadline, "sleep never started");
        tokio::task::yield_now().await;
    }
    t.send(json!({"type": "signal", "sig": "INT"})).await;
    let mark = t.screen.len();
    t.type_text("echo rc=$?\n").await;
    t.wait_for(mark, "rc=130").await;
    // The shell itself survived the interrupt.
    let mark = t.screen.len();
    t.type_text("echo alive\n").await;
    t.wait_for(mark, "alive").await;
    sb.client().delete_pty(&id).await.unwrap();
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_compat_protocol_runs_init_and_reports_exit() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut ws = connect(&sb, "/v1/pty/compat").await;
    let init = json!({"type": "init", "cmd": ["sh", "-c", "read x; echo got-$x; exit 3"],
                      "env": {}, "cwd": "/", "rows": 24, "cols": 80, "login_shell": false});
    ws.send(Message::Text(init.to_string().into()))
        .await
        .unwrap();
    let mut frames = Vec::new();
    let mut output = Vec::new();
    let mut typed = false;
    let code = loop {
        let msg = tokio::time::timeout(SCREEN_LIMIT, ws.next())
            .await
            .expect("compat terminal went quiet");
        let Some(Ok(Message::Text(text))) = msg else {
            panic!("closed without exit: {frames:?}");
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        frames.push(v["type"].as_str().unwrap_or("").to_string());
        match v["type"].as_str() {
            Some("ready") => {
                assert!(v["pid"].as_u64().unwrap() > 1);
                if !typed {
                    typed = true;
                    let stdin = json!({"type": "stdin", "data": b64_encode(b"abc\n")});
                    ws.send(Message::Text(stdin.to_string().into()))
                        .await
                        .unwrap();
                }
            }
            Some("stdout") => output.extend(b64_decode(v["data"].as_str().unwrap()).unwrap()),
            Some("exit") => break v["code"].as_i64().unwrap(),
            other => panic!("unexpected frame {other:?}: {text}"),
        }
    };
    assert_eq!(frames.first().map(String::as_str), Some("ready"));
    assert_eq!(code, 3);
    assert!(
        contains(&output, b"got-abc"),
        "{:?}",
        String::from_utf8_lossy(&output)
    );

    // A first frame that is not init closes with 4400.
    let mut ws = connect(&sb, "/v1/pty/compat").await;
    let bad = json!({"type": "stdin", "data": ""});
    ws.send(Message::Text(bad.to_string().into()))
        .await
        .unwrap();
    let close = loop {
        match tokio::time::timeout(SCREEN_LIMIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(u16::from(close.expect("a close code").code), 4400);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_nobody_watches_is_closed_after_its_idle_timeout() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let req = PtyCreate {
        command: sh(),
        idle_timeout_ms: Some(300),
        ..Default::default()
    };
    let id = sb.client().create_pty(&req).await.unwrap().id;
    let deadline = Instant::now() + Duration::from_secs(10);
    while sb.client().pty(&id).await.unwrap().alive {
        assert!(Instant::now() < deadline, "idle terminal was never closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sb.stop();
}

async fn agent_rss_kib(sb: &Sandbox) -> u64 {
    // Read by the agent itself: /proc/self is the agent (PID 1 is its init).
    let status = sb.client().read_file("/proc/self/status").await.unwrap();
    String::from_utf8_lossy(&status)
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The agent's open fds but its sockets: those are the test client's connections, and
/// the client's pool (hyper-util's) may open one more when a request beats the return
/// of the previous connection to the pool. Leaks of a command's pipes or terminals show.
/// Read from the host: the files API refuses the agent's own descriptors.
async fn agent_fds(sb: &Sandbox) -> usize {
    // The agent is the first child of the container's init (agent/src/pid1/init.rs).
    let init = sb.pid1_host_pid();
    let children =
        std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).unwrap_or_default();
    let agent = children
        .split_whitespace()
        .next()
        .map_or(init.to_string(), str::to_string);
    let dir = format!("/proc/{agent}/fd");
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| !target.to_string_lossy().starts_with("socket:"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_runs_a_thousand_commands_without_growing() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let s = c.create_session(&SessionCreate::default()).await.unwrap();
    let run = |i: usize| SessionRun {
        command: format!("x=$(( {i} * 2 )); echo $x"),
        timeout_ms: Some(10_000),
    };
    for i in 0..50 {
        c.session_run(&s.id, &run(i)).await.unwrap();
    }
    let (rss, fds) = (agent_rss_kib(&sb).await, agent_fds(&sb).await);
    for i in 0..1000 {
        let r = c.session_run(&s.id, &run(i)).await.unwrap();
        assert_eq!(r.stdout.text_lossy(), format!("{}\n", i * 2));
    }
    let (rss_after, fds_after) = (agent_rss_kib(&sb).await, agent_fds(&sb).await);
    assert_eq!(fds_after, fds, "open fds grew over 1000 commands");
    assert!(
        rss_after <= rss + 1024,
        "agent RSS grew from {rss} KiB to {rss_after} KiB over 1000 commands"
    );
    c.delete_session(&s.id).await.unwrap();
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_commands_sent_at_once_run_one_after_another() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let s = c.create_session(&SessionCreate::default()).await.unwrap();
    let runs = (0..5).map(|i| {
        let id = s.id.clone();
        async move {
            let run = SessionRun {
                command: format!(
                    "echo start-{i} >> /tmp/order; sleep 0.1; echo end-{i} >> /tmp/order"
                ),
                timeout_ms: Some(10_000),
            };
            c.session_run(&id, &run).await.unwrap()
        }
    });
    for r in futures_util::future::join_all(runs).await {
        assert_eq!(r.exit_code, Some(0));
    }
    let log = c.read_file("/tmp/order").await.unwrap();
    let lines: Vec<&str> = std::str::from_utf8(&log).unwrap().lines().collect();
    assert_eq!(lines.len(), 10, "{lines:?}");
    for pair in lines.chunks(2) {
        let start = pair[0].strip_prefix("start-").expect("a start line");
        assert_eq!(
            pair[1],
            format!("end-{start}"),
            "commands overlapped: {lines:?}"
        );
    }
    sb.stop();
}

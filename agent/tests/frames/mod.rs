//! `POST /v1/exec/stream` with `Accept: application/vnd.orchard.exec-frames`: output as
//! binary frames, byte for byte (no base64), events as JSON frames, and the NDJSON
//! default untouched for clients that do not ask.

use orchard_client::Frame;
use orchard_protocol::exec::ExitInfo;
use orchard_protocol::{Command, ExecEvent, ExecRequest};

use crate::util::*;

fn shell(s: &str) -> ExecRequest {
    ExecRequest {
        command: Command::Shell(s.into()),
        ..Default::default()
    }
}

/// Every frame of one binary stream.
async fn frames_of(sb: &Sandbox, req: &ExecRequest) -> Vec<Frame> {
    let mut stream = ok("exec_frames", sb.client().exec_frames(req)).await;
    let mut frames = Vec::new();
    while let Some(f) = ok("next frame", stream.next()).await {
        frames.push(f);
    }
    frames
}

/// Start, then stdout and stderr exactly as written (every byte value, in order),
/// then exit with the byte counts: what the NDJSON stream carries, without base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_frames_carry_output_byte_for_byte_between_start_and_exit() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    // 200,000 lines, then all 256 byte values on stderr.
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    let frames = frames_of(
        &sb,
        &shell("seq 1 200000; i=0; while [ $i -lt 256 ]; do printf \"\\\\$(printf %o $i)\" >&2; i=$((i+1)); done; exit 3"),
    )
    .await;
    assert!(
        matches!(frames.first(), Some(Frame::Event(ExecEvent::Start { pid })) if *pid > 1),
        "first frame: {:?}",
        frames.first()
    );
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    for f in &frames[1..frames.len() - 1] {
        match f {
            Frame::Stdout(b) => stdout.extend_from_slice(b),
            Frame::Stderr(b) => stderr.extend_from_slice(b),
            Frame::Event(ExecEvent::Keepalive) => {}
            other => panic!("unexpected frame in the middle: {other:?}"),
        }
    }
    assert!(
        stdout == expected.as_bytes(),
        "stdout differs: {} bytes",
        stdout.len()
    );
    assert_eq!(stderr, (0..=255u8).collect::<Vec<u8>>());
    match frames.last() {
        Some(Frame::Event(ExecEvent::Exit {
            exit: ExitInfo { exit_code, .. },
            stdout_bytes,
            stderr_bytes,
        })) => {
            assert_eq!(*exit_code, Some(3));
            assert_eq!(*stdout_bytes, expected.len() as u64);
            assert_eq!(*stderr_bytes, 256);
        }
        other => panic!("last frame: {other:?}"),
    }
    sb.stop();
}

/// A timed-out command's extra stderr line (with `timeout_exit_124`) comes as a
/// stderr frame, and a client that does not ask still gets NDJSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_line_is_a_stderr_frame_and_ndjson_stays_the_default() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut req = shell("sleep 5");
    req.timeout_ms = Some(200);
    req.timeout_exit_124 = true;
    let frames = frames_of(&sb, &req).await;
    let stderr: Vec<u8> = frames
        .iter()
        .filter_map(|f| match f {
            Frame::Stderr(b) => Some(b.to_vec()),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(
        String::from_utf8_lossy(&stderr).contains("timed out"),
        "stderr: {:?}",
        String::from_utf8_lossy(&stderr)
    );
    assert!(
        matches!(frames.last(), Some(Frame::Event(ExecEvent::Exit { exit, .. })) if exit.exit_code == Some(124)),
        "{:?}",
        frames.last()
    );
    // The default framing: NDJSON lines, whose output is base64.
    let mut s = ok("exec_stream", sb.client().exec_stream(&shell("echo hi"))).await;
    let mut out = Vec::new();
    while let Some(ev) = ok("next", s.next()).await {
        if let ExecEvent::Stdout { data } = ev {
            out.extend(orchard_protocol::output::b64_decode(&data).unwrap());
        }
    }
    assert_eq!(out, b"hi\n");
    sb.stop();
}

/// Regression: an output frame went out as two channel messages (header, then
/// payload), so another sender (the other stream's pump, or the keepalive task) could
/// put a message between them and corrupt the stream. Stdout and stderr at once, a
/// reader slow enough to keep the queue full, keepalives every 10 ms: every byte must
/// arrive in well-formed frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_frame_is_never_split_from_its_payload() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::start(
        RootfsKind::Busybox,
        SandboxOpts::agent_args(&["--keepalive-ms", "10"]),
    );
    let mb = 16;
    let req = shell(&format!(
        "head -c {n} /dev/zero & head -c {n} /dev/zero >&2; wait",
        n = mb << 20
    ));
    let mut stream = ok("exec_frames", sb.client().exec_frames(&req)).await;
    let (mut out, mut err, mut n) = (0usize, 0usize, 0u64);
    let mut last = None;
    while let Some(f) = ok("next frame", stream.next()).await {
        n += 1;
        if n % 8 == 0 {
            // A slow reader: the agent's queue fills and its senders wait.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        match &f {
            Frame::Stdout(b) => out += b.len(),
            Frame::Stderr(b) => err += b.len(),
            Frame::Event(_) => {}
        }
        last = Some(f);
    }
    assert_eq!((out, err), (mb << 20, mb << 20));
    assert!(
        matches!(&last, Some(Frame::Event(ExecEvent::Exit { exit, .. })) if exit.exit_code == Some(0)),
        "{last:?}"
    );
    sb.stop();
}

//! `POST /v1/exec` and `POST /v1/exec/stream`: commands, their input, output, exit and time limit.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_argv_without_a_shell_and_shell_strings_with_one() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    // argv: no word splitting, no expansion, program looked up on PATH.
    let r = sb.exec(argv(&["echo", "a  b", "$HOME", "*"])).await;
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.text_lossy(), "a  b $HOME *\n");
    assert!(r.pid > 1, "a command is not PID 1: {r:?}");
    // Shell string: expansion and pipes.
    let r = sb.sh("echo $((6 * 7)) | tr 4 X").await;
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.text_lossy(), "X2\n");
    assert_eq!(r.stderr.text_lossy(), "");
    // stderr is captured apart from stdout.
    let r = sb.sh("echo out; echo err >&2").await;
    assert_eq!(r.stdout.text_lossy(), "out\n");
    assert_eq!(r.stderr.text_lossy(), "err\n");
    assert_eq!(r.stdout.encoding, Encoding::Utf8);
    assert_eq!(r.stdout.total_bytes, 4);
    assert!(!r.stdout.truncated);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_uses_cwd_and_env_and_hides_the_token() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut req = argv(&["pwd"]);
    req.cwd = Some("/workspace".into());
    assert_eq!(sb.exec(req).await.stdout.text_lossy(), "/workspace\n");
    // The default cwd is the agent's: /.
    assert_eq!(sb.exec(argv(&["pwd"])).await.stdout.text_lossy(), "/\n");

    let mut req = shell("echo \"$GREETING $WHO\"; env");
    req.env.insert("GREETING".into(), "hello".into());
    req.env.insert("WHO".into(), "world".into());
    let r = sb.exec(req).await;
    let out = r.stdout.text_lossy();
    assert!(out.starts_with("hello world\n"), "{out}");
    assert!(
        out.contains("PATH="),
        "the agent's PATH is inherited: {out}"
    );
    assert!(
        !out.contains("ORCHARD_AGENT_TOKEN") && !out.contains(&sb.token),
        "commands must not see the token: {out}"
    );
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_feeds_stdin_as_text_and_as_base64() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut req = argv(&["cat"]);
    req.stdin = Some("line one\nline two\n".into());
    let r = sb.exec(req).await;
    assert_eq!(r.stdout.text_lossy(), "line one\nline two\n");

    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let mut req = argv(&["cat"]);
    req.stdin_b64 = Some(b64_encode(&bytes));
    let r = sb.exec(req).await;
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.encoding, Encoding::Base64);
    assert_eq!(r.stdout.bytes().unwrap(), bytes);

    // Without stdin the command reads EOF at once instead of hanging.
    let mut req = argv(&["wc", "-c"]);
    req.timeout_ms = Some(5_000);
    let r = sb.exec(req).await;
    assert!(!r.timed_out);
    assert_eq!(r.stdout.text_lossy().trim(), "0");

    // Both at once is refused.
    let mut req = argv(&["cat"]);
    req.stdin = Some("a".into());
    req.stdin_b64 = Some(b64_encode(b"a"));
    let err = sb.exec_err(req).await;
    assert_api_error(&err, 400, ErrorCode::InvalidArgument);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_reports_exit_codes_and_killing_signals() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let r = sb.sh("exit 7").await;
    assert_eq!((r.exit_code, r.signal, r.timed_out), (Some(7), None, false));
    let r = sb.sh("kill -9 $$").await;
    assert_eq!((r.exit_code, r.signal, r.timed_out), (None, Some(9), false));
    let r = sb.exec(argv(&["false"])).await;
    assert_eq!(r.exit_code, Some(1));
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_timeout_kills_the_command_and_says_timed_out() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut req = argv(&["sleep", "30"]);
    req.timeout_ms = Some(300);
    let t0 = Instant::now();
    let r = sb.exec(req).await;
    let took = t0.elapsed();
    assert!(r.timed_out, "{r:?}");
    assert_eq!((r.exit_code, r.signal), (None, Some(15)), "{r:?}");
    assert!(
        took < Duration::from_millis(1_300),
        "returned after {took:?}, not within timeout + 1 s"
    );
    assert!(r.duration_ms >= 300.0, "{r:?}");
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_reports_the_commands_duration() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let t0 = Instant::now();
    let r = sb.exec(argv(&["sleep", "0.3"])).await;
    let wall = t0.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(r.exit_code, Some(0));
    assert!(
        r.duration_ms >= 290.0 && r.duration_ms <= wall + 1.0,
        "duration {} ms, wall {wall} ms",
        r.duration_ms
    );
    let r = sb.exec(argv(&["true"])).await;
    assert!(r.duration_ms < 250.0, "{r:?}");
    sb.stop();
}

// ---------------------------------------------------------------------------------------
// Streamed exec
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_stream_sends_start_then_output_losslessly_in_order_then_exit() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    let mut stream = ok(
        "exec_stream",
        sb.client()
            .exec_stream(&shell("seq 1 200000; echo to-stderr >&2; exit 3")),
    )
    .await;
    let mut frames = Vec::new();
    while let Some(frame) = ok("next frame", stream.next()).await {
        frames.push(frame);
    }
    assert!(
        matches!(frames.first(), Some(ExecEvent::Start { pid }) if *pid > 1),
        "first frame: {:?}",
        frames.first()
    );
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    for frame in &frames[1..frames.len() - 1] {
        match frame {
            ExecEvent::Stdout { data } => stdout.extend(b64_decode(data).unwrap()),
            ExecEvent::Stderr { data } => stderr.extend(b64_decode(data).unwrap()),
            ExecEvent::Keepalive => {}
            other => panic!("unexpected frame in the middle: {other:?}"),
        }
    }
    assert!(
        String::from_utf8(stdout.clone()).unwrap() == expected,
        "stdout reassembled from {} frames differs: {} bytes, expected {}",
        frames.len(),
        stdout.len(),
        expected.len()
    );
    assert_eq!(stderr, b"to-stderr\n");
    match frames.last() {
        Some(ExecEvent::Exit {
            exit:
                ExitInfo {
                    exit_code,
                    signal,
                    timed_out,
                    ..
                },
            stdout_bytes,
            stderr_bytes,
        }) => {
            assert_eq!((*exit_code, *signal, *timed_out), (Some(3), None, false));
            assert_eq!(*stdout_bytes, expected.len() as u64);
            assert_eq!(*stderr_bytes, 10);
        }
        other => panic!("last frame: {other:?}"),
    }
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_stream_sends_keepalives_while_the_command_is_quiet() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::start(
        RootfsKind::Busybox,
        SandboxOpts::agent_args(&["--keepalive-ms", "100"]),
    );
    let mut stream = sb
        .client()
        .exec_stream(&shell("sleep 1; echo done"))
        .await
        .unwrap();
    let mut frames = Vec::new();
    while let Some(ev) = stream.next().await.unwrap() {
        frames.push(ev);
    }
    let keepalives = frames
        .iter()
        .filter(|f| matches!(f, ExecEvent::Keepalive))
        .count();
    assert!(
        keepalives >= 3,
        "{keepalives} keepalives in 1 s at 100 ms: {frames:?}"
    );
    assert!(matches!(frames.first(), Some(ExecEvent::Start { .. })));
    assert!(matches!(frames.last(), Some(ExecEvent::Exit { .. })));
    sb.stop();
}

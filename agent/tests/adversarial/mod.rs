//! Adversarial commands and requests: runaway output, fork bombs, memory hogs, bad JSON, bad tokens, floods.

use super::*;

/// A field of the agent's `/proc/PID/status` inside the sandbox, in kB (the agent is
/// the parent of the commands it starts; PID 1 is its init).
async fn agent_status_kb(sb: &Sandbox, field: &str) -> u64 {
    let r = sb.exec(argv(&["sh", "-c", "cat /proc/$PPID/status"])).await;
    let status = r.stdout.text_lossy();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in the agent's status:\n{status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_grandchild_holding_stdout_does_not_hold_the_exec() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let t0 = Instant::now();
    let r = sb.sh("sleep 1000 & echo started").await;
    let took = t0.elapsed();
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.text_lossy(), "started\n");
    assert!(!r.timed_out);
    assert!(took < Duration::from_millis(1_500), "took {took:?}");
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_ignoring_sigterm_is_killed_after_the_grace_period() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut req = shell("trap '' TERM; sleep 1000");
    req.timeout_ms = Some(500);
    let t0 = Instant::now();
    let r = sb.exec(req).await;
    let took = t0.elapsed();
    assert!(r.timed_out, "{r:?}");
    assert_eq!((r.exit_code, r.signal), (None, Some(9)), "{r:?}");
    assert!(
        took < Duration::from_millis(1_500),
        "returned after {took:?}, not within timeout + 1 s"
    );
    // The ignoring sleep is gone too, not left running.
    let procs = sandbox_processes(&sb).await;
    assert!(
        !procs.iter().any(|(_, comm, _)| comm == "sleep"),
        "{procs:?}"
    );
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gigabyte_of_output_is_truncated_and_agent_memory_stays_bounded() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let cap = ok("health", sb.client().health())
        .await
        .limits
        .max_output_bytes;
    let mut req = argv(&["head", "-c", "1073741824", "/dev/zero"]);
    req.timeout_ms = Some(120_000);
    let r = sb.exec(req).await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let out = &r.stdout;
    assert!(out.truncated);
    assert_eq!(out.total_bytes, 1 << 30);
    let kept = out.bytes().unwrap();
    assert_eq!(kept.len() as u64, cap);
    assert!(kept.iter().all(|b| *b == 0));
    assert_eq!(out.omitted_at, Some(cap / 2));
    let peak_kb = agent_status_kb(&sb, "VmHWM").await;
    assert!(
        peak_kb < 64 * 1024,
        "the agent's peak RSS was {peak_kb} kB while capturing 1 GiB"
    );
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb_under_a_pids_limit_times_out_and_the_agent_recovers() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::start(
        RootfsKind::Busybox,
        SandboxOpts {
            pids_limit: Some(64),
            ..SandboxOpts::default()
        },
    );
    // busybox sh gives up at the first failed fork, so the loop runs in a subshell
    // while the leader becomes a `sleep` (exec: no fork), and the command lasts until
    // its timeout with the pids limit used up by the loop's sleeps.
    let mut req = shell("(while true; do sleep 10 & done) 2>/dev/null & exec sleep 1000");
    req.timeout_ms = Some(2_000);
    let bomb = async {
        let t0 = Instant::now();
        let r = within(Duration::from_secs(30), sb.client().exec(&req))
            .await
            .unwrap_or_else(|e| panic!("the fork bomb exec failed: {e}\n{}", sb.diagnostics()));
        (r, t0.elapsed())
    };
    let meanwhile = async {
        // Once the limit is used up, the agent still answers, and refuses new
        // commands with spawn_failed instead of hanging.
        poll_until(
            Duration::from_secs(10),
            "the fork bomb fills the pids limit",
            || async {
                let h = ok("health during the bomb", sb.client().health()).await;
                if h.processes >= 40 {
                    Ok(())
                } else {
                    Err(format!("{} processes", h.processes))
                }
            },
        )
        .await;
        within(CALL_LIMIT, sb.client().exec(&argv(&["true"]))).await
    };
    let ((r, took), during) = tokio::join!(bomb, meanwhile);
    assert!(r.timed_out, "{r:?}");
    assert!(took < Duration::from_secs(8), "took {took:?}");
    match during {
        // Regression: the sandbox's own process limit was answered as a server error.
        Err(e) => assert_api_error(&e, 429, ErrorCode::SpawnFailed),
        // A pid may have been free for a moment.
        Ok(r) => assert_eq!(r.exit_code, Some(0)),
    }
    poll_until(
        Duration::from_secs(15),
        "the agent runs commands again after the fork bomb",
        || async {
            match within(CALL_LIMIT, sb.client().exec(&shell("echo ok"))).await {
                Ok(r) if r.stdout.text_lossy() == "ok\n" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_hog_under_a_memory_limit_is_killed_and_the_agent_survives() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::start(
        RootfsKind::Busybox,
        SandboxOpts {
            memory_limit: Some(64 << 20),
            ..SandboxOpts::default()
        },
    );
    // dd allocates its 256 MiB block and fills it from /dev/zero.
    let mut req = argv(&["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]);
    req.timeout_ms = Some(30_000);
    let r = sb.exec(req).await;
    assert_eq!((r.exit_code, r.signal), (None, Some(9)), "{r:?}");
    let h = ok("health", sb.client().health()).await;
    assert!(h.pid1);
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_output_comes_back_as_base64_with_exact_bytes() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let format: String = (0..=255u8).map(|b| format!("\\{b:03o}")).collect();
    let r = sb.exec(argv(&["printf", &format])).await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.stdout.encoding, Encoding::Base64);
    let expected: Vec<u8> = (0..=255u8).collect();
    assert_eq!(r.stdout.bytes().unwrap(), expected);
    assert_eq!(r.stdout.total_bytes, 256);
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_cwd_is_cwd_not_found() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut req = argv(&["true"]);
    req.cwd = Some("/no/such/dir".into());
    assert_api_error(&sb.exec_err(req).await, 400, ErrorCode::CwdNotFound);
    let mut req = argv(&["true"]);
    req.cwd = Some("/etc/passwd".into());
    assert_api_error(&sb.exec_err(req).await, 400, ErrorCode::CwdNotFound);
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_command_is_command_not_found() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let err = sb.exec_err(argv(&["/no/such/program"])).await;
    assert_api_error(&err, 400, ErrorCode::CommandNotFound);
    let err = sb.exec_err(argv(&["no-such-program-on-path"])).await;
    assert_api_error(&err, 400, ErrorCode::CommandNotFound);
    let err = sb.exec_err(argv(&["/etc/passwd"])).await;
    assert_api_error(&err, 400, ErrorCode::CommandNotFound);
    let err = fails(
        "process of a missing program",
        sb.client().start_process(&argv(&["/no/such/program"])),
    )
    .await;
    assert_api_error(&err, 400, ErrorCode::CommandNotFound);
    sb.assert_still_serving().await;
    sb.stop();
}

async fn post_exec_raw(sb: &Sandbox, body: &'static str) -> orchard_client::RawResponse {
    ok(
        "raw exec",
        sb.client().send(
            Method::POST,
            "/v1/exec",
            Bytes::from(body),
            "application/json",
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_invalid_json() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    for body in [
        r#"{"command": ["echo""#,
        "",
        "not json",
        r#"{"command": ["echo"]} trailing"#,
    ] {
        let raw = post_exec_raw(&sb, body).await;
        assert_eq!(raw.status.as_u16(), 400, "body {body:?}");
        assert_eq!(
            error_body(&raw).code,
            ErrorCode::InvalidJson,
            "body {body:?}"
        );
    }
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_types_are_invalid_json() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    for body in [
        r#"{"command": 5}"#,
        r#"{"command": ["echo", 1]}"#,
        r#"{"command": ["true"], "timeout_ms": "soon"}"#,
        r#"{"command": ["true"], "env": ["A=1"]}"#,
        r#"{"command": ["true"], "unknown_field": 1}"#,
        "{}",
        "null",
        "42",
    ] {
        let raw = post_exec_raw(&sb, body).await;
        assert_eq!(raw.status.as_u16(), 400, "body {body}");
        assert_eq!(error_body(&raw).code, ErrorCode::InvalidJson, "body {body}");
    }
    sb.assert_still_serving().await;
    sb.stop();
}

/// serde reads a struct from a JSON array too, field by field, so `["echo hi"]` ran
/// `echo hi` and `["rm -rf /tmp/x", "/bin/sh"]` would pick the shell positionally. A
/// request body is an object; anything else is a wrong type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_json_array_body_is_not_read_as_positional_fields() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    for body in [r#"["echo"]"#, r#"["mkdir /tmp/positional"]"#] {
        let raw = post_exec_raw(&sb, body).await;
        assert_eq!(
            raw.status.as_u16(),
            400,
            "body {body} answered {}",
            String::from_utf8_lossy(&raw.body)
        );
        assert_eq!(error_body(&raw).code, ErrorCode::InvalidJson, "body {body}");
    }
    let r = sb.sh("test -e /tmp/positional && echo RAN").await;
    assert_eq!(r.stdout.text_lossy(), "", "an array body ran a command");
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_token_is_unauthorized_and_runs_nothing() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let raw = raw_request(&sb.socket, "GET", "/v1/health", &[], b"").unwrap();
    assert_eq!(raw.status, 401);
    assert_eq!(raw.json()["code"], "unauthorized");
    let body = br#"{"command": ["mkdir", "/tmp/pwned"]}"#;
    let raw = raw_request(
        &sb.socket,
        "POST",
        "/v1/exec",
        &[("Content-Type", "application/json")],
        body,
    )
    .unwrap();
    assert_eq!(raw.status, 401);
    assert_eq!(raw.json()["code"], "unauthorized");
    let r = sb.sh("test -e /tmp/pwned && echo PWNED").await;
    assert_eq!(r.stdout.text_lossy(), "", "a request without token ran");
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_is_unauthorized() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let token = sb.token.clone();
    for wrong in [
        "wrong".to_string(),
        String::new(),
        token[..token.len() - 1].to_string(),
        format!("{token}x"),
        token.to_uppercase(),
    ] {
        let c = sb.client().with_token(wrong.clone());
        let err = fails("health with a wrong token", c.health()).await;
        assert_api_error(&err, 401, ErrorCode::Unauthorized);
        let err = fails("exec with a wrong token", c.exec(&argv(&["true"]))).await;
        assert_api_error(&err, 401, ErrorCode::Unauthorized);
    }
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_replaces_the_old_one_for_every_route() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let old = sb.client();
    // Refused: too short, and a rotation needs the current token.
    let err = fails("a short token", old.rotate_token("short")).await;
    assert_api_error(&err, 400, ErrorCode::InvalidArgument);
    let stranger = sb.client().with_token("not-the-token");
    let err = fails(
        "rotation with a wrong token",
        stranger.rotate_token(&"n".repeat(32)),
    )
    .await;
    assert_api_error(&err, 401, ErrorCode::Unauthorized);

    let new_token = "claimed-0123456789abcdef".to_string();
    assert!(old.rotate_token(&new_token).await.unwrap().rotated);
    let err = fails("exec with the old token", old.exec(&argv(&["true"]))).await;
    assert_api_error(&err, 401, ErrorCode::Unauthorized);
    let new = sb.client().with_token(new_token);
    let r = new.exec(&argv(&["echo", "still here"])).await.unwrap();
    assert_eq!(r.stdout.text_lossy(), "still here\n");
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_is_body_too_large() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::start(
        RootfsKind::Busybox,
        SandboxOpts::agent_args(&["--max-body-bytes", "1024"]),
    );
    let mut req = argv(&["cat"]);
    req.stdin = Some("x".repeat(2048));
    let err = sb.exec_err(req.clone()).await;
    assert_api_error(&err, 413, ErrorCode::BodyTooLarge);
    // Without a Content-Length the limit holds as well.
    let body = serde_json::to_vec(&req).unwrap();
    let auth = orchard_protocol::TOKEN_HEADER;
    let raw = raw_request(
        &sb.socket,
        "POST",
        "/v1/exec",
        &[
            (auth, sb.token.as_str()),
            ("Content-Type", "application/json"),
            ("Transfer-Encoding", "chunked"),
        ],
        &body,
    )
    .unwrap();
    assert_eq!(raw.status, 413, "{:?}", String::from_utf8_lossy(&raw.body));
    assert_eq!(raw.json()["code"], "body_too_large");
    // A body under the limit is served.
    let mut small = argv(&["cat"]);
    small.stdin = Some("y".repeat(100));
    assert_eq!(sb.exec(small).await.stdout.text_lossy(), "y".repeat(100));
    sb.assert_still_serving().await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_execs_each_get_their_own_exit_status() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..40 {
        let client = orchard_client::AgentClient::new(
            orchard_client::Endpoint::Unix(sb.socket.clone()),
            sb.token.clone(),
        );
        tasks.spawn(async move {
            let script = if n % 2 == 0 {
                format!("exit {n}")
            } else {
                format!("echo {n}; exit {n}")
            };
            let r = within(CALL_LIMIT, client.exec(&shell(&script))).await;
            (n, r)
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (n, r) = done.unwrap();
        let r = r.unwrap_or_else(|e| panic!("exec {n}: {e}"));
        assert_eq!(r.exit_code, Some(n), "exec {n}: {r:?}");
        let expected = if n % 2 == 0 {
            String::new()
        } else {
            format!("{n}\n")
        };
        assert_eq!(r.stdout.text_lossy(), expected, "exec {n}");
    }
    assert_eq!(ok("health", sb.client().health()).await.running_execs, 0);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_stream_kill_on_disconnect_kills_a_chatty_command() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut req = shell("while true; do echo tick; sleep 0.05; done");
    req.kill_on_disconnect = true;
    let mut stream = ok("exec_stream", sb.client().exec_stream(&req)).await;
    let Some(ExecEvent::Start { pid }) = ok("start frame", stream.next()).await else {
        panic!("no start frame");
    };
    let first = ok("output frame", stream.next()).await;
    assert!(matches!(first, Some(ExecEvent::Stdout { .. })), "{first:?}");
    drop(stream);
    let gone = format!("test -e /proc/{pid}");
    poll_until(
        Duration::from_secs(10),
        "the command is killed on disconnect",
        || async {
            match sb.sh(&gone).await.exit_code {
                Some(1) => Ok(()),
                _ => Err(format!("pid {pid} still exists")),
            }
        },
    )
    .await;
    sb.stop();
}

/// `kill_on_disconnect` only acted when a write of output failed, so a command that
/// prints nothing (a server, `sleep`) outlived its client until its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_kill_on_disconnect_kills_a_silent_command() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut req = argv(&["sleep", "1000"]);
    req.kill_on_disconnect = true;
    let mut stream = ok("exec_stream", sb.client().exec_stream(&req)).await;
    let Some(ExecEvent::Start { pid }) = ok("start frame", stream.next()).await else {
        panic!("no start frame");
    };
    drop(stream);
    let gone = format!("test -e /proc/{pid}");
    poll_until(
        Duration::from_secs(5),
        "the silent command is killed on disconnect",
        || async {
            match sb.sh(&gone).await.exit_code {
                Some(1) => Ok(()),
                _ => Err(format!(
                    "pid {pid} (sleep 1000) still runs after its client left"
                )),
            }
        },
    )
    .await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_output_beyond_the_ring_buffer_reports_lost_bytes() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let ring = ok("health", c.health()).await.limits.process_buffer_bytes;
    let expected: String = (1..=500_000).map(|i| format!("{i}\n")).collect();
    let total = expected.len() as u64;
    assert!(total > ring, "the output must overflow the ring");
    let p = ok("start", c.start_process(&argv(&["seq", "1", "500000"]))).await;
    let done = ok("wait", c.wait_process(&p.id, 20_000)).await;
    assert_eq!(done.state, ProcessState::Exited);
    assert_eq!(done.stdout_bytes, total);
    let o = ok("output", c.process_output(&p.id, 0, 0)).await;
    let kept = total - ring;
    assert_eq!(o.stdout.offset, kept);
    assert_eq!(o.stdout.lost_bytes, kept);
    assert_eq!(o.stdout.next_offset, total);
    assert!(
        text(&o.stdout.data) == expected[kept as usize..],
        "the ring must hold exactly the last {ring} bytes"
    );
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_concurrent_commands_are_refused_until_one_ends() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::start(
        RootfsKind::Busybox,
        SandboxOpts::agent_args(&["--max-concurrent-execs", "2"]),
    );
    let c = sb.client();
    let a = ok("start a", c.start_process(&argv(&["sleep", "1000"]))).await;
    ok("start b", c.start_process(&argv(&["sleep", "1000"]))).await;
    let err = fails("third process", c.start_process(&argv(&["sleep", "1"]))).await;
    assert_api_error(&err, 429, ErrorCode::TooManyExecs);
    let err = sb.exec_err(argv(&["true"])).await;
    assert_api_error(&err, 429, ErrorCode::TooManyExecs);
    ok("delete a", c.delete_process(&a.id)).await;
    poll_until(Duration::from_secs(10), "a slot is free again", || async {
        match within(CALL_LIMIT, c.exec(&argv(&["true"]))).await {
            Ok(r) if r.exit_code == Some(0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_stdin_is_fed_whole_and_unread_stdin_does_not_hang() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut req = argv(&["wc", "-c"]);
    req.stdin = Some("z".repeat(4 << 20));
    let r = sb.exec(req).await;
    assert_eq!(r.stdout.text_lossy().trim(), (4 << 20).to_string());
    let mut req = argv(&["true"]);
    req.stdin = Some("z".repeat(4 << 20));
    req.timeout_ms = Some(10_000);
    let t0 = Instant::now();
    let r = sb.exec(req).await;
    assert_eq!(r.exit_code, Some(0));
    assert!(!r.timed_out);
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t0.elapsed()
    );
    sb.assert_still_serving().await;
    sb.stop();
}

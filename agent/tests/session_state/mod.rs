//! `GET /v1/sessions/{id}/state` and `POST /v1/sessions` with `restore`: a session's
//! directory, exported variables and functions captured between commands, and the
//! session brought back from them, in another agent or after it was deleted.

use orchard_client::AgentClient;
use orchard_protocol::session::{SessionCreate, SessionInfo, SessionRun, SessionRunResult};
use orchard_protocol::ErrorCode;

use crate::util::*;

async fn create(c: &AgentClient, req: SessionCreate) -> SessionInfo {
    ok("create session", c.create_session(&req)).await
}

fn restore(state: &orchard_protocol::session::SessionState) -> SessionCreate {
    SessionCreate {
        restore: Some(state.clone()),
        ..Default::default()
    }
}

/// Runs `command` in session `id`; it must succeed.
async fn run(c: &AgentClient, id: &str, command: &str) -> SessionRunResult {
    let req = SessionRun {
        command: command.into(),
        timeout_ms: None,
    };
    let r = ok("session run", c.session_run(id, &req)).await;
    assert_eq!(r.exit_code, Some(0), "{command:?}: {r:?}");
    r
}

/// A bash session's directory, exact exported variables (quotes, an unset HOME) and
/// functions come back in another agent and, after a delete, in the same one, under
/// the same id; the restored shell's state captures as the original's did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bash_session_is_captured_and_restored_exactly() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::start(RootfsKind::BusyboxBash, SandboxOpts::default());
    let c = sb.client();
    let s = create(c, SessionCreate::default()).await;
    assert_eq!(s.shell, "/bin/bash");
    run(c, &s.id, "mkdir -p /tmp/x").await;
    run(
        c,
        &s.id,
        r#"cd /tmp/x && export FOO='a b'"'"'c' && unset HOME; f() { echo "hi $1"; }"#,
    )
    .await;
    let state = ok("state", c.session_state(&s.id)).await;
    assert_eq!(
        (state.id.as_str(), state.shell.as_str()),
        (s.id.as_str(), "/bin/bash")
    );
    assert_eq!(state.cwd, "/tmp/x");
    assert_eq!(state.env.get("FOO").map(String::as_str), Some("a b'c"));
    assert!(state.env.contains_key("PATH"), "{:?}", state.env);
    for absent in ["HOME", "_", "__orchard_c"] {
        assert!(
            !state.env.contains_key(absent),
            "{absent} in {:?}",
            state.env
        );
    }
    assert!(state.functions.contains("f ()"), "{:?}", state.functions);
    // A capture is not a command of the session.
    assert_eq!(ok("get", c.list_sessions()).await.sessions[0].commands, 2);

    let expected = "/tmp/x\na b'c\nhi x\nunset\n";
    let check = r#"pwd; echo "$FOO"; f x; echo ${HOME-unset}"#;

    // In another agent.
    let sb2 = Sandbox::start(RootfsKind::BusyboxBash, SandboxOpts::default());
    let c2 = sb2.client();
    sb2.sh("mkdir -p /tmp/x").await;
    let back = create(c2, restore(&state)).await;
    assert_eq!((back.id.as_str(), back.commands), (s.id.as_str(), 0));
    assert_eq!(run(c2, &back.id, check).await.stdout.text_lossy(), expected);
    let again = ok("state of the restored session", c2.session_state(&back.id)).await;
    assert_eq!(
        again, state,
        "the restored session captures as the original"
    );
    // Fresh ids do not collide with the restored one.
    let fresh = create(c2, SessionCreate::default()).await;
    assert_ne!(fresh.id, back.id);
    sb2.stop();

    // In the same agent, after the original was deleted.
    ok("delete", c.delete_session(&s.id)).await;
    let back = create(c, restore(&state)).await;
    assert_eq!(back.id, s.id);
    assert_eq!(run(c, &back.id, check).await.stdout.text_lossy(), expected);
    sb.stop();
}

/// A POSIX sh session (busybox ash) gets its directory and exported variables back; it
/// cannot list functions, so it has none to restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sh_session_is_restored_with_its_env_and_cwd_and_no_functions() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let s = create(c, SessionCreate::default()).await;
    assert_eq!(s.shell, "/bin/sh");
    run(
        c,
        &s.id,
        "mkdir -p /tmp/y && cd /tmp/y && export BAR='x y' && g() { echo g; }",
    )
    .await;
    let state = ok("state", c.session_state(&s.id)).await;
    assert_eq!(state.cwd, "/tmp/y");
    assert_eq!(state.env.get("BAR").map(String::as_str), Some("x y"));
    assert_eq!(state.functions, "");
    ok("delete", c.delete_session(&s.id)).await;
    let back = create(c, restore(&state)).await;
    let r = run(c, &back.id, r#"pwd; echo "$BAR""#).await;
    assert_eq!(r.stdout.text_lossy(), "/tmp/y\nx y\n");
    let again = ok("state of the restored session", c.session_state(&back.id)).await;
    assert_eq!(again, state);
    sb.stop();
}

/// A capture asked for while a command runs waits for it, and sees the directory the
/// command left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_waits_for_the_running_command() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let s = create(c, SessionCreate::default()).await;
    let runner = c.with_token(sb.token.clone());
    let id = s.id.clone();
    let command = tokio::spawn(async move {
        let req = SessionRun {
            command: "sleep 0.5; cd /tmp".into(),
            timeout_ms: None,
        };
        runner.session_run(&id, &req).await
    });
    // Counted once it holds the session: from then on the capture has to wait.
    let deadline = std::time::Instant::now() + CALL_LIMIT;
    while ok("list", c.list_sessions()).await.sessions[0].commands == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started"
        );
        tokio::task::yield_now().await;
    }
    // Had it not waited, it would see the directory from before the command: `/`.
    let state = ok("state", c.session_state(&s.id)).await;
    assert_eq!(state.cwd, "/tmp");
    assert_eq!(command.await.unwrap().unwrap().exit_code, Some(0));
    sb.stop();
}

/// A session whose shell runs as the image's user (`--user`) is captured too: its
/// directory is read as that user, which root without CAP_SYS_PTRACE (a sandbox's
/// capabilities, as here, do not include it) could not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_the_images_user_is_captured() {
    orchard_test_support::require_runc!();
    let opts = SandboxOpts {
        capabilities: vec!["CAP_SETUID".into(), "CAP_SETGID".into()],
        ..SandboxOpts::agent_args(&["--user", "1000:1000"])
    };
    let sb = Sandbox::start(RootfsKind::Busybox, opts);
    let c = sb.client();
    let s = create(c, SessionCreate::default()).await;
    run(c, &s.id, "cd /tmp && export WHO=$(id -u)").await;
    let state = ok("state", c.session_state(&s.id)).await;
    assert_eq!(state.cwd, "/tmp");
    assert_eq!(state.env.get("WHO").map(String::as_str), Some("1000"));
    sb.stop();
}

/// What is refused, and how: restore with a taken or invalid id, with `shell`, into a
/// missing directory, with functions that fail (no session is left); the state of an
/// unknown or ended session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captures_and_restores_that_cannot_be_done_are_refused() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let s = create(c, SessionCreate::default()).await;
    let state = ok("state", c.session_state(&s.id)).await;

    let e = fails("restore a taken id", c.create_session(&restore(&state))).await;
    assert_api_error(&e, 409, ErrorCode::AlreadyExists);
    let mut req = restore(&state);
    req.shell = Some("/bin/sh".into());
    let e = fails("restore with a shell", c.create_session(&req)).await;
    assert_api_error(&e, 400, ErrorCode::InvalidArgument);
    let mut moved = state.clone();
    moved.id = "elsewhere".into();
    moved.cwd = "/tmp/gone".into();
    let e = fails(
        "restore into a missing cwd",
        c.create_session(&restore(&moved)),
    )
    .await;
    assert_api_error(&e, 400, ErrorCode::CwdNotFound);
    assert!(e.to_string().contains("/tmp/gone"), "{e}");
    let mut bad = state.clone();
    bad.id = "a/b".into();
    let e = fails("restore an invalid id", c.create_session(&restore(&bad))).await;
    assert_api_error(&e, 400, ErrorCode::InvalidArgument);
    let mut broken = state.clone();
    broken.id = "broken".into();
    broken.functions = "f() {".into();
    let e = fails(
        "restore broken functions",
        c.create_session(&restore(&broken)),
    )
    .await;
    assert_api_error(&e, 400, ErrorCode::InvalidArgument);
    let ids: Vec<String> = ok("list", c.list_sessions())
        .await
        .sessions
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(
        ids,
        vec![s.id.clone()],
        "nothing left of the failed restores"
    );

    let e = fails("state of nothing", c.session_state("s999")).await;
    assert_api_error(&e, 404, ErrorCode::NotFound);
    let r = ok(
        "exit",
        c.session_run(
            &s.id,
            &SessionRun {
                command: "exit 3".into(),
                timeout_ms: None,
            },
        ),
    )
    .await;
    assert!(!r.session_alive, "{r:?}");
    let e = fails("state of an ended session", c.session_state(&s.id)).await;
    assert_api_error(&e, 409, ErrorCode::ProcessExited);
    sb.stop();
}

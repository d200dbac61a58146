//! Shell sessions (no typed client methods yet: raw JSON over the client).

use super::*;

pub(crate) async fn session_create(sb: &Sandbox) -> SessionInfo {
    let raw = ok(
        "create session",
        sb.client().send(
            Method::POST,
            "/v1/sessions",
            Bytes::from("{}"),
            "application/json",
        ),
    )
    .await;
    assert!(
        raw.status.is_success(),
        "create session: {} {}",
        raw.status,
        String::from_utf8_lossy(&raw.body)
    );
    serde_json::from_slice(&raw.body).expect("a SessionInfo")
}

/// `POST /v1/sessions/{id}/run`: the result, or the error body.
async fn session_try_run(
    sb: &Sandbox,
    id: &str,
    command: &str,
    timeout_ms: Option<u64>,
) -> Result<SessionRunResult, (u16, ErrorBody)> {
    let mut body = serde_json::json!({ "command": command });
    if let Some(t) = timeout_ms {
        body["timeout_ms"] = t.into();
    }
    let raw = ok(
        "session run",
        sb.client().send(
            Method::POST,
            &format!("/v1/sessions/{id}/run"),
            Bytes::from(serde_json::to_vec(&body).unwrap()),
            "application/json",
        ),
    )
    .await;
    if raw.status.is_success() {
        Ok(serde_json::from_slice(&raw.body).expect("a SessionRunResult"))
    } else {
        Err((raw.status.as_u16(), error_body(&raw)))
    }
}

async fn session_run(sb: &Sandbox, id: &str, command: &str) -> SessionRunResult {
    session_try_run(sb, id, command, None)
        .await
        .unwrap_or_else(|e| panic!("session run {command:?}: {e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_keeps_cwd_env_and_functions_between_commands() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let s = session_create(&sb).await;
    assert!(s.alive);
    let r = session_run(
        &sb,
        &s.id,
        "cd /tmp && export FOO=bar && greet() { echo \"hi $1\"; }",
    )
    .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let r = session_run(&sb, &s.id, "pwd; echo $FOO; greet you").await;
    assert_eq!(r.stdout.text_lossy(), "/tmp\nbar\nhi you\n");
    assert!(r.session_alive);
    let info: SessionInfo = {
        let raw = ok(
            "get session",
            sb.client().send(
                Method::GET,
                &format!("/v1/sessions/{}", s.id),
                Bytes::new(),
                "application/json",
            ),
        )
        .await;
        serde_json::from_slice(&raw.body).unwrap()
    };
    assert_eq!(info.commands, 2);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_run_captures_output_exactly_and_reports_exit_codes() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let s = session_create(&sb).await;
    let r = session_run(&sb, &s.id, "printf abc; printf err >&2; (exit 3)").await;
    assert_eq!(r.stdout.text_lossy(), "abc", "no newline added: {r:?}");
    assert_eq!(r.stderr.text_lossy(), "err");
    assert_eq!(r.exit_code, Some(3));
    let r = session_run(&sb, &s.id, r#"echo 'it'"'"'s'; echo "$((1+1))""#).await;
    assert_eq!(r.stdout.text_lossy(), "it's\n2\n");
    // A command that reads stdin gets EOF instead of the commands after it.
    let r = session_run(&sb, &s.id, "read x; echo \"got:$x\"; cat").await;
    assert_eq!(r.stdout.text_lossy(), "got:\n");
    let format: String = (0..=255u8).map(|b| format!("\\{b:03o}")).collect();
    let r = session_run(&sb, &s.id, &format!("printf '{format}'")).await;
    assert_eq!(r.stdout.bytes().unwrap(), (0..=255u8).collect::<Vec<u8>>());
    assert_eq!(
        session_run(&sb, &s.id, "echo still")
            .await
            .stdout
            .text_lossy(),
        "still\n"
    );
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_command_timeout_interrupts_it_and_the_session_survives() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let s = session_create(&sb).await;
    session_run(&sb, &s.id, "cd /tmp").await;
    let t0 = Instant::now();
    let r = session_try_run(&sb, &s.id, "sleep 1000", Some(300))
        .await
        .unwrap();
    let took = t0.elapsed();
    assert!(r.timed_out, "{r:?}");
    assert!(r.session_alive, "{r:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let r = session_run(&sb, &s.id, "pwd").await;
    assert_eq!(
        r.stdout.text_lossy(),
        "/tmp\n",
        "the session kept its state"
    );
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_exit_ends_it_and_later_runs_are_refused() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let s = session_create(&sb).await;
    let r = session_run(&sb, &s.id, "exit 5").await;
    assert!(!r.session_alive, "{r:?}");
    assert_eq!(r.exit_code, Some(5));
    let (status, body) = session_try_run(&sb, &s.id, "echo hi", None)
        .await
        .unwrap_err();
    assert_eq!((status, body.code), (409, ErrorCode::ProcessExited));
    let (status, body) = session_try_run(&sb, "s999999", "echo hi", None)
        .await
        .unwrap_err();
    assert_eq!((status, body.code), (404, ErrorCode::NotFound));
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_delete_kills_the_shell_and_its_background_jobs() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let s = session_create(&sb).await;
    let r = session_run(&sb, &s.id, "sleep 1000 > /dev/null 2>&1 & echo $!").await;
    let job: u32 = r.stdout.text_lossy().trim().parse().unwrap();
    let raw = ok(
        "delete session",
        sb.client().send(
            Method::DELETE,
            &format!("/v1/sessions/{}", s.id),
            Bytes::new(),
            "application/json",
        ),
    )
    .await;
    assert!(raw.status.is_success());
    let check = format!(
        "test -e /proc/{} || test -e /proc/{job} || echo gone",
        s.pid
    );
    poll_until(
        Duration::from_secs(10),
        "session shell and job are gone",
        || async {
            match sb.sh(&check).await.stdout.text_lossy().as_str() {
                "gone\n" => Ok(()),
                _ => Err(format!("shell {} or job {job} still exists", s.pid)),
            }
        },
    )
    .await;
    sb.stop();
}

/// Under a POSIX shell (busybox sh, dash) an error of a special builtin inside `eval`
/// exits a non-interactive shell: a syntax error, `. missing-file` (a missing venv
/// activate script), a failed redirection of `:`, a bad `export`. Each ended the whole
/// session. (`command eval` keeps the shell alive in all these cases.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_session_survives_errors_that_are_fatal_to_a_posix_shell() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let mut died = Vec::new();
    for command in [
        "if then fi",
        ". /no/such/activate",
        ": > /no/such/dir/file",
        "export 1x=y",
    ] {
        let s = session_create(&sb).await;
        session_run(&sb, &s.id, "cd /tmp && export KEEP=kept").await;
        let r = session_run(&sb, &s.id, command).await;
        assert_ne!(r.exit_code, Some(0), "{command}: {r:?}");
        if !r.session_alive {
            died.push(command);
            continue;
        }
        let r = session_run(&sb, &s.id, "pwd; echo $KEEP").await;
        assert_eq!(r.stdout.text_lossy(), "/tmp\nkept\n", "after {command}");
    }
    assert!(died.is_empty(), "sessions died of {died:?}");
    sb.stop();
}

/// A timeout interrupted every descendant of the session's shell, then killed those
/// still alive, so it also killed the background jobs (servers, watchers) that
/// earlier commands had started (non-interactive shells start them ignoring SIGINT,
/// so they survive the interrupt but not the kill that follows when the timed-out
/// command itself ignores SIGINT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_session_timeout_spares_background_jobs_of_earlier_commands() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let s = session_create(&sb).await;
    let r = session_run(&sb, &s.id, "sleep 1000 > /dev/null 2>&1 & echo $!").await;
    let job: u32 = r.stdout.text_lossy().trim().parse().unwrap();
    let r = session_try_run(&sb, &s.id, "trap '' INT; sleep 30", Some(300))
        .await
        .unwrap();
    assert!(r.timed_out, "{r:?}");
    let alive = sb
        .sh(&format!(
            "grep -q '^State:.*[RS]' /proc/{job}/status && echo alive"
        ))
        .await;
    assert_eq!(
        alive.stdout.text_lossy(),
        "alive\n",
        "the background job of an earlier command was killed by this command's timeout"
    );
    sb.stop();
}

/// A run whose client went away left its command running in the shell; the next run
/// then returned the rest of that command's output and its end marker as its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_session_run_abandoned_by_its_client_does_not_leak_into_the_next() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let s = session_create(&sb).await;
    let body = serde_json::json!({"command": "sleep 1; echo first"});
    let abandoned = tokio::time::timeout(
        Duration::from_millis(200),
        sb.client().send(
            Method::POST,
            &format!("/v1/sessions/{}/run", s.id),
            Bytes::from(serde_json::to_vec(&body).unwrap()),
            "application/json",
        ),
    )
    .await;
    assert!(abandoned.is_err(), "the first run should still be going");
    let r = session_run(&sb, &s.id, "echo second").await;
    assert_eq!(r.stdout.text_lossy(), "second\n", "{r:?}");
    assert_eq!(r.exit_code, Some(0));
    sb.stop();
}

//! `POST /v1/exec` with a `result_id` and `GET /v1/exec/results/{id}`: a command that
//! outlives its caller (an orchestrator replica that died), its result collected later.

use std::time::{Duration, Instant};

use orchard_protocol::process::ProcessState;
use orchard_protocol::ErrorCode;

use crate::util::*;

/// A caller that goes away mid-command (its connection closed, as when an orchestrator
/// replica dies): the command runs on, and `GET /v1/exec/results/{id}` delivers its
/// real result; a result the caller received is not kept; an id in use is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_with_a_result_id_outlives_its_caller_and_its_result_is_collected() {
    use std::io::Write;
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();

    // The caller: a raw connection that sends the exec and closes before the answer.
    let body = serde_json::json!({
        "command": "read line < /tmp/go-on; echo \"kept $line\"; echo err >&2; exit 3",
        "shell": "/bin/sh",
        "result_id": "job-left",
    })
    .to_string();
    sb.sh("mkfifo /tmp/go-on").await;
    let mut stream = std::os::unix::net::UnixStream::connect(&sb.socket).unwrap();
    write!(
        stream,
        "POST /v1/exec HTTP/1.1\r\nHost: agent\r\n{}: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        orchard_protocol::TOKEN_HEADER,
        sb.token,
        body.len()
    )
    .unwrap();
    // Registered before the command starts: visible as running (or refused as unknown
    // until the agent read the request).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.exec_result("job-left", 0).await {
            Ok(k) => {
                assert_eq!(k.state, ProcessState::Running, "{k:?}");
                break;
            }
            Err(e) if e.code() == Some(ErrorCode::NotFound) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "the exec never registered");
        tokio::task::yield_now().await;
    }
    drop(stream);
    // The same id while it runs: refused.
    let again = c
        .exec(&orchard_protocol::ExecRequest {
            command: orchard_protocol::Command::Shell("true".into()),
            result_id: Some("job-left".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Some(ErrorCode::AlreadyExists), "{again}");
    // The command goes on only now, after its caller left.
    sb.sh("echo on > /tmp/go-on").await;
    let kept = c.exec_result("job-left", 20_000).await.unwrap();
    assert_eq!(kept.state, ProcessState::Exited, "{kept:?}");
    let r = kept.result.unwrap();
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.stdout.text_lossy(), "kept on\n");
    assert_eq!(r.stderr.text_lossy(), "err\n");
    // Kept for the next collector too.
    let twice = c.exec_result("job-left", 0).await.unwrap();
    assert_eq!(twice.result.map(|r| r.exit_code), Some(Some(3)));

    // A caller that stays gets its answer, and nothing is kept.
    let stayed = c
        .exec(&orchard_protocol::ExecRequest {
            command: orchard_protocol::Command::Shell("echo here".into()),
            result_id: Some("job-stayed".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(stayed.stdout.text_lossy(), "here\n");
    let gone = c.exec_result("job-stayed", 0).await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::NotFound), "{gone}");

    // Elsewhere a result_id means nothing, and says so.
    let streamed = c
        .start_process(&orchard_protocol::ExecRequest {
            command: orchard_protocol::Command::Shell("true".into()),
            result_id: Some("p".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        streamed.code(),
        Some(ErrorCode::InvalidArgument),
        "{streamed}"
    );
}

//! Background processes (`/v1/processes`): stdin, output by offset, signals, waits.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_reads_stdin_writes_output_by_offset_and_exits_on_eof() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let p = ok("start cat", c.start_process(&argv(&["cat"]))).await;
    assert_eq!(p.state, ProcessState::Running);
    assert!(p.stdin_open);
    assert_eq!(p.argv, vec!["cat"]);

    let write = |data: &str, eof: bool| StdinWrite {
        data: Some(data.into()),
        data_b64: None,
        eof,
    };
    ok("stdin", c.write_stdin(&p.id, &write("hello\n", false))).await;
    let first = poll_until(Duration::from_secs(10), "cat echoes hello", || async {
        let o = ok("output", c.process_output(&p.id, 0, 0)).await;
        if text(&o.stdout.data) == "hello\n" {
            Ok(o)
        } else {
            Err(format!("{o:?}"))
        }
    })
    .await;
    assert_eq!((first.stdout.offset, first.stdout.next_offset), (0, 6));
    assert_eq!(first.stdout.lost_bytes, 0);

    ok("stdin", c.write_stdin(&p.id, &write("world\n", false))).await;
    let next = first.stdout.next_offset;
    let second = poll_until(Duration::from_secs(10), "cat echoes world", || async {
        let o = ok("output", c.process_output(&p.id, next, 0)).await;
        if !o.stdout.data.is_empty() {
            Ok(o)
        } else {
            Err(format!("{o:?}"))
        }
    })
    .await;
    assert_eq!(
        text(&second.stdout.data),
        "world\n",
        "only what follows the offset"
    );
    assert_eq!((second.stdout.offset, second.stdout.next_offset), (6, 12));

    let info = ok("eof", c.write_stdin(&p.id, &write("", true))).await;
    assert!(!info.stdin_open);
    let done = ok("wait", c.wait_process(&p.id, 10_000)).await;
    assert_eq!(
        done.state,
        ProcessState::Exited,
        "cat must exit on EOF: {done:?}"
    );
    assert_eq!(
        done.exit.map(|e| (e.exit_code, e.signal)),
        Some((Some(0), None))
    );
    assert_eq!(done.stdout_bytes, 12);

    // Output stays readable after the exit; stdin is gone.
    let o = ok("output after exit", c.process_output(&p.id, 0, 0)).await;
    assert_eq!(text(&o.stdout.data), "hello\nworld\n");
    assert_eq!(o.process.state, ProcessState::Exited);
    let err = fails("stdin after exit", c.write_stdin(&p.id, &write("x", false))).await;
    assert_api_error(&err, 409, ErrorCode::ProcessExited);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_signal_term_ends_it_with_signal_15() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let p = ok("start", c.start_process(&argv(&["sleep", "1000"]))).await;
    let req = SignalRequest {
        signal: Signal::Name("TERM".into()),
        group: true,
    };
    ok("signal", c.signal(&p.id, &req)).await;
    let done = ok("wait", c.wait_process(&p.id, 10_000)).await;
    assert_eq!(done.state, ProcessState::Exited, "{done:?}");
    let exit = done.exit.unwrap();
    assert_eq!(
        (exit.exit_code, exit.signal, exit.timed_out),
        (None, Some(15), false)
    );
    // An exited process cannot be signalled.
    let err = fails("signal after exit", c.signal(&p.id, &req)).await;
    assert_api_error(&err, 409, ErrorCode::ProcessExited);
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_with_a_timeout_is_killed_when_it_expires() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let mut req = argv(&["sleep", "1000"]);
    req.timeout_ms = Some(300);
    let p = ok("start", c.start_process(&req)).await;
    let done = ok("wait", c.wait_process(&p.id, 10_000)).await;
    assert_eq!(done.state, ProcessState::Exited, "{done:?}");
    let exit = done.exit.unwrap();
    assert!(exit.timed_out, "{exit:?}");
    assert_eq!(exit.signal, Some(15));
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_wait_with_a_short_timeout_answers_running() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let p = ok("start", c.start_process(&argv(&["sleep", "1000"]))).await;
    let t0 = Instant::now();
    let info = ok("wait", c.wait_process(&p.id, 200)).await;
    let took = t0.elapsed();
    assert_eq!(info.state, ProcessState::Running);
    assert!(info.exit.is_none());
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_secs(3),
        "a 200 ms wait took {took:?}"
    );
    ok("delete", c.delete_process(&p.id)).await;
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_list_get_delete_and_unknown_ids() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let a = ok("start a", c.start_process(&argv(&["sleep", "1000"]))).await;
    let b = ok("start b", c.start_process(&shell("echo b"))).await;
    ok("wait b", c.wait_process(&b.id, 10_000)).await;

    let list = ok("list", c.list_processes()).await;
    let ids: Vec<&str> = list.processes.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, vec![a.id.as_str(), b.id.as_str()]);
    assert_eq!(list.processes[0].state, ProcessState::Running);
    assert_eq!(list.processes[1].state, ProcessState::Exited);
    assert_eq!(list.processes[1].argv, vec!["/bin/sh", "-c", "echo b"]);
    let got = ok("get", c.process(&a.id)).await;
    assert_eq!((got.pid, got.state), (a.pid, ProcessState::Running));

    // Deleting a running process kills it and forgets it.
    ok("delete a", c.delete_process(&a.id)).await;
    let err = fails("get deleted", c.process(&a.id)).await;
    assert_api_error(&err, 404, ErrorCode::NotFound);
    let gone = format!("test -e /proc/{}", a.pid);
    poll_until(
        Duration::from_secs(10),
        "deleted process is killed",
        || async {
            let r = sb.sh(&gone).await;
            if r.exit_code == Some(1) {
                Ok(())
            } else {
                Err(format!("/proc/{} still exists", a.pid))
            }
        },
    )
    .await;
    ok("delete b", c.delete_process(&b.id)).await;
    assert!(ok("list", c.list_processes()).await.processes.is_empty());

    let unknown = "p999999";
    let w = StdinWrite::default();
    let s = SignalRequest {
        signal: Signal::Number(15),
        group: true,
    };
    let errs = [
        fails("get", c.process(unknown)).await,
        fails("output", c.process_output(unknown, 0, 0)).await,
        fails("stdin", c.write_stdin(unknown, &w)).await,
        fails("signal", c.signal(unknown, &s)).await,
        fails("wait", c.wait_process(unknown, 100)).await,
        fails("delete", c.delete_process(unknown)).await,
    ];
    for err in &errs {
        assert_api_error(err, 404, ErrorCode::NotFound);
    }
    sb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_output_and_exit_are_retrievable_after_it_ends() {
    orchard_test_support::require_runc!();
    let sb = Sandbox::busybox();
    let c = sb.client();
    let p = ok(
        "start",
        c.start_process(&shell("echo out; echo err >&2; exit 4")),
    )
    .await;
    let done = ok("wait", c.wait_process(&p.id, 10_000)).await;
    assert_eq!(done.state, ProcessState::Exited);
    assert_eq!(done.exit.unwrap().exit_code, Some(4));
    let o = ok("output", c.process_output(&p.id, 0, 0)).await;
    assert_eq!(text(&o.stdout.data), "out\n");
    assert_eq!(text(&o.stderr.data), "err\n");
    assert_eq!((o.stdout.next_offset, o.stderr.next_offset), (4, 4));
    let o = ok("output at the end", c.process_output(&p.id, 4, 4)).await;
    assert_eq!((o.stdout.data.as_str(), o.stdout.offset), ("", 4));
    assert_eq!(ok("get", c.process(&p.id)).await.exit, done.exit);
    sb.stop();
}

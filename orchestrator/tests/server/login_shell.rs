//! Login shells on a SWE-bench-style image (`swe:latest` from `make images`): its
//! `~/.bashrc` activates a conda environment after the guard that returns early in
//! non-interactive shells. `login_shell: true` must get past the guard on jobs and on
//! terminals, and the noise of a shell without a terminal must not reach stderr.

use serde_json::{json, Value};

use super::v1_routes::{close_code, next_json, send_json, ws_connect};
use crate::util::server::{import, TestServer, KEY};
use orchard_protocol::output::b64_decode;

/// A ready `swe:latest` sandbox on `srv`.
async fn swe_sandbox(srv: &TestServer) -> String {
    import(srv.service.images(), "swe", "swe:latest");
    let (s, created) = srv.post("/sandboxes", json!({"image": "swe:latest"})).await;
    assert_eq!(s, 200, "{created}");
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    let (s, ready) = srv.get(&format!("/sandboxes/{id}/wait?timeout=60")).await;
    assert_eq!(s, 200, "{ready}");
    id
}

async fn job(srv: &TestServer, id: &str, command: &str, login_shell: bool) -> Value {
    let (s, job) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": command, "login_shell": login_shell, "wait": true}),
        )
        .await;
    assert_eq!(s, 200, "{job}");
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_shell_activates_the_bashrc_environment_without_noise() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = swe_sandbox(&srv).await;
    let probe = "echo env=$CONDA_DEFAULT_ENV; command -v python; testbed-tool ok";

    // Without a login shell the guard returns early: no environment.
    let plain = job(&srv, &id, probe, false).await;
    assert_eq!(plain["stdout"], "env=\n/usr/bin/python\n", "{plain}");

    // With one, ~/.bashrc runs past its guard; stderr holds nothing of the shell's.
    let login = job(&srv, &id, probe, true).await;
    assert_eq!(login["status"], "succeeded", "{login}");
    assert_eq!(
        login["stdout"], "env=testbed\n/opt/miniconda3/envs/testbed/bin/python\ntestbed-tool ok\n",
        "{login}"
    );
    assert_eq!(login["stderr"], "", "{login}");
    // The working directory is the sandbox's (/workspace, as Orchard's pods), the exit
    // code the command's, and the command's own stderr is kept.
    let r = job(&srv, &id, "pwd; echo real-error >&2; (exit 3)", true).await;
    assert_eq!(r["stdout"], "/workspace\n", "{r}");
    assert_eq!(r["stderr"], "real-error\n", "{r}");
    assert_eq!(r["exit_code"], 3, "{r}");
    assert_eq!(r["status"], "failed", "{r}");

    // A broken conda in ~/.bashrc prints an import traceback: removed; the command's
    // own traceback is kept.
    let r = job(
        &srv,
        &id,
        "echo \"python3 -c 'import conda_cli_that_is_gone'\" >> ~/.bashrc",
        false,
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = job(&srv, &id, "echo $CONDA_DEFAULT_ENV; python -c '1/0'", true).await;
    assert_eq!(r["stdout"], "testbed\n", "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    assert!(!stderr.contains("ModuleNotFoundError"), "{stderr}");
    assert!(!stderr.contains("job control"), "{stderr}");
    assert!(
        stderr.starts_with("Traceback (most recent call last):\n")
            && stderr.ends_with("ZeroDivisionError: division by zero\n"),
        "{stderr}"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_shell_terminal_activates_the_bashrc_environment() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = swe_sandbox(&srv).await;
    let path = format!("/sandboxes/{id}/exec/pty?api_key={KEY}");
    let (mut ws, _) = ws_connect(&srv, &path, &[]).await;
    send_json(
        &mut ws,
        json!({"type": "init", "cmd": ["printenv", "CONDA_DEFAULT_ENV"], "env": {},
               "cwd": "/testbed", "rows": 24, "cols": 80, "login_shell": true}),
    )
    .await;
    assert_eq!(next_json(&mut ws).await["type"], "ready");
    let mut out = String::new();
    loop {
        let f = next_json(&mut ws).await;
        match f["type"].as_str() {
            Some("stdout") => out.push_str(&String::from_utf8_lossy(
                &b64_decode(f["data"].as_str().unwrap()).unwrap(),
            )),
            Some("exit") => {
                assert_eq!(f["code"], 0, "{f} {out:?}");
                break;
            }
            _ => panic!("unexpected frame {f}"),
        }
    }
    assert!(out.ends_with("testbed\r\n"), "{out:?}");
    close_code(&mut ws).await;
    srv.finish().await;
}

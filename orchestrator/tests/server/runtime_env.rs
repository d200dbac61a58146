//! What every container gives a program, through the compatible API (issue 31): the
//! runtime's `/etc/hosts`, `/etc/hostname` and `HOSTNAME` on python, busybox and an
//! image with no `/etc` at all (no files whatever), a server on `localhost` reached by
//! that name; and limits above what this host has, lowered to it and said so instead of
//! refused, on a sandbox then used for a while with idle gaps.

use std::time::Duration;

use serde_json::{json, Value};

use super::v1_routes::{next_json, send_json, ws_connect};
use crate::util::server::{import, TestServer, KEY};
use orchard_protocol::output::{b64_decode, b64_encode};

/// A ready sandbox of `image` made through the compatible API; answers its id.
async fn ready(srv: &TestServer, body: Value) -> (String, Value) {
    let (s, created) = srv.post("/sandboxes", body).await;
    assert_eq!(s, 200, "{created}");
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    let (s, got) = srv.get(&format!("/sandboxes/{id}/wait?timeout=60")).await;
    assert_eq!(s, 200, "{got}");
    (id, created)
}

/// Runs `command` as a compatible job; answers its stdout, failing on a non-zero exit.
async fn job_ok(srv: &TestServer, id: &str, command: &str) -> String {
    let (s, job) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": command, "wait": true, "timeout_seconds": 60}),
        )
        .await;
    assert_eq!(s, 200, "{job}");
    assert_eq!(job["status"], "succeeded", "{command}: {job}");
    job["stdout"].as_str().unwrap_or_default().to_string()
}

/// A file of sandbox `id` read through the compatible files route.
async fn file(srv: &TestServer, id: &str, path: &str) -> String {
    let (s, f) = srv.get(&format!("/sandboxes/{id}/files?path={path}")).await;
    assert_eq!(s, 200, "{path}: {f}");
    String::from_utf8(b64_decode(f["content"].as_str().unwrap()).unwrap()).unwrap()
}

/// The hosts file of a sandbox named `id` without egress.
fn assert_hosts(hosts: &str, id: &str) {
    assert!(hosts.starts_with("127.0.0.1\tlocalhost\n"), "{hosts}");
    assert!(
        hosts.contains("::1\tlocalhost ip6-localhost ip6-loopback\n"),
        "{hosts}"
    );
    assert!(hosts.contains(&format!("127.0.1.1\t{id}\n")), "{hosts}");
}

/// What a terminal's shell prints for `script`.
async fn pty_output(srv: &TestServer, id: &str, script: &str) -> String {
    let path = format!("/sandboxes/{id}/exec/pty?api_key={KEY}");
    let (mut ws, _) = ws_connect(srv, &path, &[]).await;
    send_json(
        &mut ws,
        json!({"type": "init", "cmd": ["sh", "-c", script], "env": {}, "cwd": "/",
               "rows": 24, "cols": 80, "login_shell": false}),
    )
    .await;
    let mut out = String::new();
    loop {
        let f = next_json(&mut ws).await;
        match f["type"].as_str() {
            Some("ready") => {}
            Some("stdout") => out.push_str(&String::from_utf8_lossy(
                &b64_decode(f["data"].as_str().unwrap()).unwrap(),
            )),
            Some("exit") => return out,
            _ => panic!("unexpected frame {f}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_busybox_and_an_image_without_etc_get_the_runtimes_files_and_name() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    import(srv.service.images(), "python", "python:3.11-slim");
    import(srv.service.images(), "empty", "empty:latest");

    // busybox: the files, the name everywhere (job, terminal), a server on localhost.
    let (bb, _) = ready(&srv, json!({"image": "busybox:latest"})).await;
    assert_hosts(&file(&srv, &bb, "/etc/hosts").await, &bb);
    assert_eq!(
        job_ok(&srv, &bb, "cat /etc/hostname; echo $HOSTNAME; hostname -i").await,
        format!("{bb}\n{bb}\n127.0.1.1\n")
    );
    assert_eq!(
        job_ok(
            &srv,
            &bb,
            "mkdir -p /tmp/www && echo served > /tmp/www/x && httpd -p 127.0.0.1:8080 -h /tmp/www \
             && wget -qO- http://localhost:8080/x"
        )
        .await,
        "served\n"
    );
    assert!(
        pty_output(&srv, &bb, "echo host=$HOSTNAME")
            .await
            .contains(&format!("host={bb}")),
        "the terminal's shell has HOSTNAME"
    );

    // python: what the issue's user ran, a server on localhost, Java-style lookups of
    // the own name, and the devices and limits.
    let (py, _) = ready(&srv, json!({"image": "python:3.11-slim"})).await;
    assert_hosts(&file(&srv, &py, "/etc/hosts").await, &py);
    let script = r#"python3 - <<'EOF'
import http.server, os, resource, socket, threading, urllib.request
socket.getaddrinfo("localhost", 80)
srv = http.server.HTTPServer(("localhost", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(urllib.request.urlopen(f"http://localhost:{srv.server_port}/").status)
print(open("/etc/hostname").read().strip(), os.environ["HOSTNAME"], socket.gethostname())
print(socket.gethostbyname(socket.gethostname()), socket.getfqdn())
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 1024)
shm = os.statvfs("/dev/shm")
print(shm.f_blocks * shm.f_frsize >> 20)
print(all(os.path.exists(f"/dev/{d}") for d in ["null", "zero", "random", "urandom", "tty", "fd/0", "pts/ptmx"]))
EOF"#;
    assert_eq!(
        job_ok(&srv, &py, script).await,
        format!("200\n{py} {py} {py}\n127.0.1.1 {py}\nTrue\n64\nTrue\n")
    );

    // An image with no files at all: the files are there, and the name in the
    // environment of what the agent starts (the agent is the one program it has).
    let (empty, _) = ready(&srv, json!({"image": "empty:latest"})).await;
    assert_hosts(&file(&srv, &empty, "/etc/hosts").await, &empty);
    assert_eq!(
        file(&srv, &empty, "/etc/hostname").await,
        format!("{empty}\n")
    );
    let (s, env) = srv
        .post(
            &format!("/v1/sandboxes/{empty}/exec"),
            json!({"command": ["/.orchard/bin/orchard-agent", "--print-env0"]}),
        )
        .await;
    assert_eq!(s, 200, "{env}");
    let env = env["stdout"]["data"].as_str().unwrap_or_default();
    assert!(
        env.split('\0').any(|kv| kv == format!("HOSTNAME={empty}")),
        "{env:?}"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_above_the_host_are_lowered_and_said_so_then_the_sandbox_serves_a_session() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    // Orchard's defaults, as its soak test asks, on a smaller host.
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(cpus < 4, "this test needs a host with fewer than 4 CPUs");
    let (id, created) = ready(
        &srv,
        json!({"image": "busybox:latest", "cpu": "4", "memory": "16Gi"}),
    )
    .await;
    assert_eq!(created["cpu"], cpus.to_string(), "{created}");
    let said = created["status_message"].as_str().unwrap_or_default();
    assert!(
        said.contains("lowered") && said.contains(&format!("cpu 4 to {cpus}")),
        "{created}"
    );
    let (_, got) = srv.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(got["status"], "ready", "{got}");
    assert_eq!(got["status_message"], said, "{got}");
    let (_, v1) = srv.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(v1["status_message"], said, "{v1}");

    // A session of calls with idle gaps between them, as a harness makes.
    for i in 0..6 {
        let (s, hb) = srv
            .post(&format!("/sandboxes/{id}/heartbeat"), json!({}))
            .await;
        assert_eq!(s, 200, "{hb}");
        assert_eq!(
            job_ok(&srv, &id, &format!("echo turn {i} > /tmp/t; cat /tmp/t")).await,
            format!("turn {i}\n")
        );
        let (s, _) = srv
            .post(
                &format!("/sandboxes/{id}/files"),
                json!({"path": format!("/workspace/f{i}"), "content": b64_encode(b"x")}),
            )
            .await;
        assert_eq!(s, 200);
        // Idle, as a model thinking between turns (the idle time is what is tested).
        tokio::time::sleep(Duration::from_millis(400 * (i % 3 + 1))).await;
    }
    let (_, list) = srv
        .get(&format!("/sandboxes/{id}/files/list?path=/workspace"))
        .await;
    assert_eq!(list["files"].as_array().map(Vec::len), Some(6), "{list}");
    srv.finish().await;
}

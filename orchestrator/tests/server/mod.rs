//! The REST API against a real server over a real local backend: the compatible routes
//! with their exact shapes, jobs, auth, quotas, policies, many creates at once, and a
//! server killed with SIGKILL and restarted.

mod bad_input;
mod bad_input_routes;
mod bench;
mod bench_hostile;
mod bench_snapshots;
mod defaults;
mod hostile_load;
mod hostile_load_storage;
mod hostile_tenants;
mod lifecycle;
mod login_shell;
mod registry_gc;
mod runtime_env;
mod snapshots;
mod token;
mod v1_files;
mod v1_routes;
mod v1_terminals;

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::util::server::{send, TestServer, KEY, OTHER_KEY};

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

const STATUS_FIELDS: &[&str] = &[
    "sandbox_id",
    "namespace",
    "image",
    "pod_name",
    "block_network",
    "cpu",
    "memory",
    "created_at",
    "ready",
    "status",
    "status_message",
    "working_dir",
];

const JOB_FIELDS: &[&str] = &[
    "job_id",
    "sandbox_id",
    "command",
    "status",
    "stdout",
    "stderr",
    "exit_code",
    "created_at",
    "started_at",
    "completed_at",
    "error",
    "output_truncated",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compatible_routes_answer_the_documented_shapes() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let (s, banner) = send(srv.http.get(format!("{}/", srv.url))).await;
    assert_eq!(s, 200, "GET / needs no key");
    assert_eq!(keys(&banner), set(&["service", "version", "status"]));
    assert_eq!(banner["status"], "running");
    let (s, health) = send(srv.http.get(format!("{}/health", srv.url))).await;
    assert_eq!((s, health["status"].as_str()), (200, Some("healthy")));

    let (s, created) = srv
        .post(
            "/sandboxes",
            json!({"image": "busybox:latest", "cpu": "500m", "memory": "256Mi", "timeout": 60}),
        )
        .await;
    assert_eq!(s, 200, "{created}");
    assert_eq!(
        keys(&created),
        set(&[
            "sandbox_id",
            "namespace",
            "image",
            "block_network",
            "cpu",
            "memory",
            "timeout",
            "status",
            "working_dir"
        ])
    );
    assert_eq!(created["status"], "pending");
    assert_eq!(
        created["block_network"], true,
        "egress is denied by default"
    );
    assert_eq!(
        (created["cpu"].as_str(), created["memory"].as_str()),
        (Some("500m"), Some("256Mi"))
    );
    assert_eq!(created["timeout"], 60);
    assert_eq!(created["working_dir"], "/workspace");
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    // A create that gives no limits is answered with the defaults: Orchard's 4 CPUs
    // and 16Gi, lowered to what this host can give a sandbox.
    let (s, bare) = srv
        .post("/sandboxes", json!({"image": "busybox:latest"}))
        .await;
    assert_eq!(s, 200, "{bare}");
    let host_cpus = std::thread::available_parallelism().unwrap().get();
    let default_cpus = host_cpus.min(4);
    assert_eq!(
        (bare["cpu"].as_str(), bare["memory"].as_str()),
        (Some(default_cpus.to_string().as_str()), Some("16Gi"))
    );
    let bare_id = bare["sandbox_id"].as_str().unwrap().to_string();
    let (s, pending) = srv.get(&format!("/sandboxes/{bare_id}")).await;
    assert_eq!(s, 200);
    assert!(
        pending["status"] == "pending" || pending["status"] == "ready",
        "{pending}"
    );
    assert!(pending["status_message"].is_string(), "always a string");
    assert!(pending["created_at"].is_f64(), "epoch seconds: {pending}");

    let (s, ready) = srv.get(&format!("/sandboxes/{id}/wait?timeout=60")).await;
    assert_eq!(s, 200, "{ready}");
    assert_eq!(keys(&ready), set(STATUS_FIELDS));
    assert_eq!(
        (ready["ready"].as_bool(), ready["status"].as_str()),
        (Some(true), Some("ready"))
    );
    assert_eq!(
        ready["status_message"], "",
        "a string even with nothing to say"
    );
    assert_eq!(ready["pod_name"], id.as_str());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let created_at = ready["created_at"].as_f64().expect("epoch seconds");
    assert!((now - created_at).abs() < 120.0, "{ready}");
    let (s, got) = srv.get(&format!("/sandboxes/{id}")).await;
    assert_eq!((s, keys(&got)), (200, set(STATUS_FIELDS)));

    srv.get(&format!("/sandboxes/{bare_id}/wait?timeout=60"))
        .await;
    let (s, res) = srv.get("/resources").await;
    assert_eq!(s, 200);
    assert_eq!(
        keys(&res),
        set(&[
            "status",
            "nodes",
            "total_capacity",
            "total_allocatable",
            "total_requested",
            "available",
            "sandbox_pods"
        ])
    );
    assert_eq!(res["status"], "ok");
    // The local backend's one node is this host, capacity and allocatable alike, with
    // no `requested` of its own and no `message` (the Kubernetes answer's additions).
    assert_eq!(res["nodes"].as_array().map(Vec::len), Some(1), "{res}");
    let node = &res["nodes"][0];
    assert_eq!(keys(node), set(&["name", "capacity", "allocatable"]));
    assert_eq!(node["capacity"], node["allocatable"]);
    assert_eq!(res["total_capacity"], node["capacity"]);
    assert_eq!(res["total_allocatable"], node["capacity"]);
    assert_eq!(keys(&res["available"]), set(&["cpu", "memory_bytes"]));
    assert!(node["capacity"]["cpu"].as_f64().unwrap() >= 1.0, "{res}");
    assert!(node["capacity"]["memory_bytes"].as_u64().unwrap() > 1 << 20);
    assert_eq!(
        res["total_requested"]["cpu"],
        0.5 + default_cpus as f64,
        "{res}"
    );
    assert_eq!(
        res["total_requested"]["memory_bytes"],
        (256u64 << 20) + (16u64 << 30)
    );
    let pods = res["sandbox_pods"].as_array().unwrap();
    assert_eq!(pods.len(), 2, "{res}");
    let pod = pods.iter().find(|p| p["name"] == id.as_str()).unwrap();
    assert_eq!(
        keys(pod),
        set(&[
            "name",
            "namespace",
            "phase",
            "cpu_request",
            "memory_request_bytes"
        ])
    );
    assert_eq!(
        (pod["phase"].as_str(), pod["cpu_request"].as_f64()),
        (Some("Running"), Some(0.5))
    );
    srv.delete(&format!("/sandboxes/{bare_id}")).await;

    // A queued job, then its wait.
    let (s, q) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": "echo out; echo err >&2; pwd"}),
        )
        .await;
    assert_eq!(s, 200, "{q}");
    assert_eq!(keys(&q), set(&["job_id", "status"]));
    assert_eq!(q["status"], "queued");
    let job_id = q["job_id"].as_str().unwrap();
    let (s, job) = srv.get(&format!("/jobs/{job_id}/wait?timeout=60")).await;
    assert_eq!(s, 200);
    assert_eq!(keys(&job), set(JOB_FIELDS));
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(
        job["stdout"], "out\n/workspace\n",
        "the default cwd is /workspace"
    );
    assert_eq!(job["stderr"], "err\n");
    assert_eq!(job["exit_code"], 0);
    assert_eq!(job["error"], Value::Null);
    for t in ["created_at", "started_at", "completed_at"] {
        assert!(
            job[t].as_f64().is_some_and(|s| (now - s).abs() < 120.0),
            "{t} in epoch seconds: {job}"
        );
    }
    assert!(job["created_at"].as_f64() <= job["started_at"].as_f64());
    assert!(job["started_at"].as_f64() <= job["completed_at"].as_f64());
    assert_eq!(job["output_truncated"], false);
    let (s, again) = srv.get(&format!("/jobs/{job_id}")).await;
    assert_eq!((s, &again), (200, &job));

    // wait=true answers the job; a non-zero exit is `failed` without `error`.
    let (s, job) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": ["sh", "-c", "echo \"$0|$X\"; exit 7", "it's a b"], "env": {"X": "y z"}, "cwd": "/tmp", "wait": true}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(keys(&job), set(JOB_FIELDS));
    assert_eq!(job["status"], "failed");
    assert_eq!(job["exit_code"], 7);
    assert_eq!(job["error"], Value::Null, "the command ran: no error");
    assert_eq!(
        job["stdout"], "it's a b|y z\n",
        "list elements are quoted one by one"
    );
    // A timeout is reported as Orchard does: 124, a last stderr line, `error`.
    let (_, job) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": "echo before >&2; sleep 30", "timeout_seconds": 0.5, "wait": true}),
        )
        .await;
    assert_eq!(job["status"], "failed");
    assert_eq!(job["exit_code"], 124, "{job}");
    assert_eq!(
        job["stderr"], "before\nCommand timed out after 0.5s and was killed\n",
        "{job}"
    );
    assert_eq!(job["error"], "Command timed out after 0.5s", "{job}");
    // login_shell runs `sh -lc` in an image without bash.
    let (_, job) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": "echo $0", "login_shell": true, "wait": true}),
        )
        .await;
    assert_eq!(job["stdout"], "sh\n", "{job}");

    // Files.
    let (s, up) = srv
        .post(
            &format!("/sandboxes/{id}/files"),
            json!({"path": "/workspace/dir/a.txt", "content": "aGVsbG8gd29ybGQ="}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        up,
        json!({"success": true, "path": "/workspace/dir/a.txt", "size": 11})
    );
    let (s, down) = srv
        .get(&format!("/sandboxes/{id}/files?path=/workspace/dir/a.txt"))
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        down,
        json!({"path": "/workspace/dir/a.txt", "content": "aGVsbG8gd29ybGQ=", "size": 11})
    );
    let (s, list) = srv.get(&format!("/sandboxes/{id}/files/list")).await;
    assert_eq!(s, 200);
    assert_eq!(list["path"], "/workspace", "the default path is /workspace");
    assert_eq!(keys(&list), set(&["path", "files", "truncated"]));
    assert_eq!(list["truncated"], false);
    let entry = &list["files"][0];
    assert_eq!(keys(entry), set(&["name", "type", "size", "modified"]));
    assert_eq!(
        (entry["name"].as_str(), entry["type"].as_str()),
        (Some("dir"), Some("directory"))
    );
    let (s, _) = srv.get(&format!("/sandboxes/{id}/files?path=/nope")).await;
    assert_eq!(s, 404, "a missing file is 404");

    // apply_patch: a patch in a git work tree, then one that does not apply.
    let (_, init) = srv
        .post(
            &format!("/sandboxes/{id}/files"),
            json!({"path": "/workspace/f.txt", "content": "b25lCnR3bwp0aHJlZQo="}),
        )
        .await;
    assert_eq!(init["success"], true);
    let patch = "diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n";
    let (s, applied) = srv
        .post(
            &format!("/sandboxes/{id}/apply_patch"),
            json!({"patch": patch}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        keys(&applied),
        set(&["success", "stdout", "stderr", "exit_code", "error"])
    );
    if applied["success"] == true {
        let (_, f) = srv.get(&format!("/sandboxes/{id}/files?path=f.txt")).await;
        assert_eq!(f["content"], "b25lClRXTwp0aHJlZQo=", "one TWO three");
        let (_, again) = srv
            .post(
                &format!("/sandboxes/{id}/apply_patch"),
                json!({"patch": patch}),
            )
            .await;
        assert_eq!(
            (again["success"].as_bool(), again["exit_code"].as_i64()),
            (Some(false), Some(1))
        );
    } else {
        assert_eq!(applied["exit_code"], 1);
    }

    let (s, hb) = srv
        .post(&format!("/sandboxes/{id}/heartbeat"), json!({}))
        .await;
    assert_eq!((s, hb), (200, json!({"status": "ok", "sandbox_id": id})));
    let (s, del) = srv.delete(&format!("/sandboxes/{id}")).await;
    assert_eq!(
        (s, del),
        (200, json!({"status": "deleted", "sandbox_id": id}))
    );
    let (s, e) = srv.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(s, 404);
    assert!(e["detail"].as_str().is_some_and(|d| d.contains(&id)), "{e}");
    let (s, _) = srv.get("/jobs/job-nope").await;
    assert_eq!(s, 404);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_one_sandbox_run_one_at_a_time_in_submission_order() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let mut ids = Vec::new();
    for i in 0..20 {
        // Each job notes whether another ran at the same time.
        let cmd = format!(
            "[ -e /tmp/busy ] && echo overlap >> /tmp/log; touch /tmp/busy; echo {i} >> /tmp/log; rm /tmp/busy"
        );
        let (s, q) = srv
            .post(&format!("/sandboxes/{id}/exec"), json!({"command": cmd}))
            .await;
        assert_eq!(s, 200);
        ids.push(q["job_id"].as_str().unwrap().to_string());
    }
    let (_, last) = srv
        .get(&format!("/jobs/{}/wait?timeout=60", ids.last().unwrap()))
        .await;
    assert_eq!(last["status"], "succeeded", "{last}");
    let (_, log) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": "cat /tmp/log", "wait": true}),
        )
        .await;
    let expected: String = (0..20).map(|i| format!("{i}\n")).collect();
    assert_eq!(log["stdout"], expected.as_str());

    // A wait that ends while the job runs answers it as running, never as finished.
    let (_, q) = srv
        .post(
            &format!("/sandboxes/{id}/exec"),
            json!({"command": "sleep 2"}),
        )
        .await;
    let job = q["job_id"].as_str().unwrap();
    let (s, running) = srv.get(&format!("/jobs/{job}/wait?timeout=0.2")).await;
    assert_eq!(s, 200);
    assert!(
        running["status"] == "running" || running["status"] == "queued",
        "{running}"
    );
    assert_eq!(running["completed_at"], Value::Null);
    assert_eq!(running["exit_code"], Value::Null);
    let (_, done) = srv.get(&format!("/jobs/{job}/wait?timeout=60")).await;
    assert_eq!(done["status"], "succeeded");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_refuses_missing_and_wrong_keys_and_hides_other_tenants_sandboxes() {
    orchard_test_support::require_runc!();
    let srv = TestServer::start().await;
    let id = srv.sandbox().await;
    let job = srv.submit(&id, "true").await;
    let routes: Vec<(reqwest::Method, String)> = vec![
        (reqwest::Method::GET, "/resources".into()),
        (reqwest::Method::POST, "/sandboxes".into()),
        (reqwest::Method::GET, format!("/sandboxes/{id}")),
        (reqwest::Method::GET, format!("/sandboxes/{id}/wait")),
        (reqwest::Method::POST, format!("/sandboxes/{id}/exec")),
        (reqwest::Method::POST, format!("/sandboxes/{id}/heartbeat")),
        (
            reqwest::Method::GET,
            format!("/sandboxes/{id}/files?path=/etc/passwd"),
        ),
        (reqwest::Method::GET, format!("/jobs/{job}")),
        (reqwest::Method::GET, "/v1/sandboxes".into()),
        (reqwest::Method::GET, format!("/v1/sandboxes/{id}")),
        (reqwest::Method::POST, format!("/v1/sandboxes/{id}/exec")),
        (reqwest::Method::GET, "/v1/images".into()),
        (reqwest::Method::DELETE, format!("/sandboxes/{id}")),
    ];
    for (m, path) in &routes {
        let url = format!("{}{path}", srv.url);
        let (s, body) = send(
            srv.http
                .request(m.clone(), &url)
                .json(&json!({"command": "true", "image": "busybox:latest"})),
        )
        .await;
        assert_eq!(s, 401, "{m} {path} without a key: {body}");
        assert!(body["detail"].is_string(), "{body}");
        let (s, _) = send(
            srv.http
                .request(m.clone(), &url)
                .header("X-API-Key", "wrong"),
        )
        .await;
        assert_eq!(s, 401, "{m} {path} with a wrong key");
    }
    // Another tenant sees nothing of this sandbox or its job.
    for (m, path) in routes
        .iter()
        .filter(|(_, p)| p.contains(&id) || p.contains(&job))
    {
        let url = format!("{}{path}", srv.url);
        let (s, body) = send(
            srv.http
                .request(m.clone(), &url)
                .header("X-API-Key", OTHER_KEY)
                .json(&json!({"command": "true"})),
        )
        .await;
        assert_eq!(s, 404, "{m} {path} as another tenant: {body}");
    }
    let (s, list) = srv.get_as(OTHER_KEY, "/v1/sandboxes").await;
    assert_eq!((s, list), (200, json!({"sandboxes": []})));
    // Bearer works too, and the sandbox is still there for its owner.
    let (s, _) = send(
        srv.http
            .get(format!("{}/sandboxes/{id}", srv.url))
            .bearer_auth(KEY),
    )
    .await;
    assert_eq!(s, 200);
    srv.finish().await;
}

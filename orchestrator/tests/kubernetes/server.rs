//! `orchard serve --backend kubernetes` (the real binary, on this host) driven through
//! the compatible API and `/v1`: create, wait, exec, direct pod-IP access, a restart
//! that adopts the pods, a pod deleted behind the server's back, capacity refusals, a
//! sandbox waiting as unschedulable until a node can take it, and the nodes' figures
//! of `/resources` and `/metrics`.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::{host_cidr, require_cluster, Capacity, TestNamespace};
use crate::util::server::{send, ServerProcess, KEY};

fn serve(kc: &Path, ns: &TestNamespace, data: &Path) -> ServerProcess {
    serve_with(kc, ns, data, &[])
}

fn serve_with(kc: &Path, ns: &TestNamespace, data: &Path, extra: &[&str]) -> ServerProcess {
    let kc = kc.to_str().unwrap();
    let cidr = host_cidr();
    let mut args = vec![
        "--backend",
        "kubernetes",
        "--kubeconfig",
        kc,
        "--namespace",
        &ns.name,
        "--kube-ingress-cidr",
        &cidr,
        "--kube-grace-period-s",
        "0",
        "--reconcile-interval-s",
        "1",
        // The test node has 2 CPUs, shared by the tests running at once.
        "--default-cpu",
        "250m",
        "--default-memory",
        "256Mi",
    ];
    args.extend_from_slice(extra);
    ServerProcess::start(data, &args)
}

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, url)
        .header("X-API-Key", KEY)
        .timeout(Duration::from_secs(300));
    if let Some(b) = body {
        req = req.json(&b);
    }
    send(req).await
}

async fn exec(url: &str, id: &str, command: &str) -> Value {
    let (s, job) = call(
        reqwest::Method::POST,
        format!("{url}/sandboxes/{id}/exec"),
        Some(json!({"command": command, "wait": true})),
    )
    .await;
    assert_eq!(s, 200, "{job}");
    job
}

/// Creates a busybox sandbox of 0.1 CPU and 64 MiB through `/v1`; answers its id.
async fn create_small(url: &str) -> String {
    let (s, sb) = call(
        reqwest::Method::POST,
        format!("{url}/v1/sandboxes"),
        Some(json!({"image": "busybox:latest", "cpu": "100m", "memory": "64Mi"})),
    )
    .await;
    assert_eq!(s, 201, "{sb}");
    sb["id"].as_str().unwrap().to_string()
}

/// Deletes sandbox `id` through the compatible route.
async fn delete(url: &str, id: &str) {
    let (s, body) = call(
        reqwest::Method::DELETE,
        format!("{url}/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compatible_api_runs_on_pods_and_a_restarted_server_adopts_them() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "compat");
    let data = tempfile::tempdir().unwrap();
    let mut first = serve(&kc, &ns, data.path());

    let (s, created) = call(
        reqwest::Method::POST,
        format!("{}/sandboxes", first.url),
        Some(json!({"image": "python:3.11-slim", "cpu": "200m", "memory": "256Mi"})),
    )
    .await;
    assert_eq!(s, 200, "{created}");
    assert_eq!(created["status"], "pending");
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    let (s, ready) = call(
        reqwest::Method::GET,
        format!("{}/sandboxes/{id}/wait?timeout=240", first.url),
        None,
    )
    .await;
    assert_eq!(s, 200, "{ready}");
    assert_eq!(ready["status"], "ready", "{ready}");
    let job = exec(
        &first.url,
        &id,
        "echo before > /tmp/mark; python3 -c 'print(1+1)'; pwd",
    )
    .await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["stdout"], "2\n/workspace\n", "{job}");

    // /v1 answers the agent's pod-IP URL and token; the agent answers them directly.
    let (s, v1) = call(
        reqwest::Method::GET,
        format!("{}/v1/sandboxes/{id}", first.url),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v1}");
    let url = v1["agent"]["url"]
        .as_str()
        .unwrap_or_else(|| panic!("{v1}"));
    let endpoint = orchard::backend::AgentEndpoint::parse_url(url).unwrap();
    let direct =
        orchard_client::AgentClient::new(endpoint.client(), v1["agent"]["token"].as_str().unwrap());
    let r = direct
        .exec(&orchard_protocol::ExecRequest {
            command: orchard_protocol::Command::Shell("cat /tmp/mark".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(r.stdout.text_lossy(), "before\n");
    // The CLI's --direct does the same: the server only names the endpoint.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orchard"))
        .args([
            "sandbox",
            "exec",
            "--direct",
            &id,
            "--",
            "sh",
            "-c",
            "cat /tmp/mark; exit 3",
        ])
        .env("SANDBOX_BASE_URL", &first.url)
        .env("SANDBOX_API_KEY", KEY)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "before\n");

    // More than the largest node has is refused up front.
    let (s, refused) = call(
        reqwest::Method::POST,
        format!("{}/sandboxes", first.url),
        Some(json!({"image": "busybox:latest", "cpu": "512"})),
    )
    .await;
    assert_eq!(s, 400, "{refused}");

    first.kill9();
    let second = serve(&kc, &ns, data.path());
    let (s, again) = call(
        reqwest::Method::GET,
        format!("{}/sandboxes/{id}", second.url),
        None,
    )
    .await;
    assert_eq!(
        (s, again["status"].as_str()),
        (200, Some("ready")),
        "{again}"
    );
    let job = exec(&second.url, &id, "cat /tmp/mark").await;
    assert_eq!(
        job["stdout"], "before\n",
        "the adopted pod kept its state: {job}"
    );

    delete(&second.url, &id).await;
    let left = ns.kubectl(&[
        "get",
        "pods,secrets",
        "-l",
        "orchard.dev/sandbox",
        "-o",
        "name",
    ]);
    assert_eq!(left, "", "delete leaves nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_behind_the_servers_back_fails_its_sandbox() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "gone");
    let data = tempfile::tempdir().unwrap();
    let srv = serve(&kc, &ns, data.path());
    let id = create_small(&srv.url).await;
    ns.kubectl(&["delete", "pod", &id, "--grace-period=0", "--wait=true"]);
    // Reconciliation runs every second: the record turns failed with the reason.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = call(
            reqwest::Method::GET,
            format!("{}/v1/sandboxes/{id}", srv.url),
            None,
        )
        .await;
        if v["status"] == "failed" {
            let m = v["status_message"].as_str().unwrap_or_default();
            // Seen while the pod terminates, or after it is gone.
            assert!(
                m.contains("disappeared") || m.contains("stopped on its own"),
                "{v}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {v}");
        // The reconciliation loop has no event to wait on from outside the server.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A sandbox no node can take yet (its pods' node selector matches no node) is
/// `unschedulable` with the scheduler's reason on both APIs while its create waits, and
/// becomes ready and runs commands once a node can take it (issue 33).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_waits_as_unschedulable_until_a_node_can_take_it() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "capacity");
    let capacity = Capacity::for_test(&kc, &ns);
    let etc = tempfile::tempdir().unwrap();
    let file = etc.path().join("orchard.toml");
    let selector: Vec<String> = capacity
        .selector()
        .iter()
        .map(|(k, v)| format!("{k:?} = {v:?}"))
        .collect();
    std::fs::write(
        &file,
        format!(
            "[kubernetes]\nnode_selector = {{ {} }}\n",
            selector.join(", ")
        ),
    )
    .unwrap();
    let data = tempfile::tempdir().unwrap();
    let srv = serve_with(&kc, &ns, data.path(), &["--config", file.to_str().unwrap()]);

    let (s, created) = call(
        reqwest::Method::POST,
        format!("{}/sandboxes", srv.url),
        Some(json!({"image": "busybox:latest", "cpu": "100m", "memory": "64Mi", "timeout": 300})),
    )
    .await;
    assert_eq!(s, 200, "{created}");
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    // The scheduler's verdict reaches the record through the pod watch: seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let waiting = loop {
        let (_, v) = call(
            reqwest::Method::GET,
            format!("{}/sandboxes/{id}", srv.url),
            None,
        )
        .await;
        if v["status"] == "unschedulable" {
            break v;
        }
        assert_eq!(v["status"], "pending", "{v}");
        assert!(
            std::time::Instant::now() < deadline,
            "never unschedulable: {v}"
        );
        // Nothing outside the server to wait on.
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let why = waiting["status_message"].as_str().unwrap_or_default();
    assert!(
        why.contains("didn't match Pod's node affinity/selector"),
        "{waiting}"
    );
    assert_eq!(waiting["ready"], false, "{waiting}");
    let (_, v1) = call(
        reqwest::Method::GET,
        format!("{}/v1/sandboxes/{id}", srv.url),
        None,
    )
    .await;
    assert_eq!(
        (&v1["status"], &v1["status_message"]),
        (&json!("unschedulable"), &waiting["status_message"]),
        "{v1}"
    );
    // Not terminal: a short wait times out, the sandbox is still waiting.
    let (s, body) = call(
        reqwest::Method::GET,
        format!("{}/sandboxes/{id}/wait?timeout=2", srv.url),
        None,
    )
    .await;
    assert_eq!(s, 408, "{body}");

    let added = std::time::Instant::now();
    capacity.add();
    let (s, ready) = call(
        reqwest::Method::GET,
        format!("{}/sandboxes/{id}/wait?timeout=120", srv.url),
        None,
    )
    .await;
    assert_eq!(s, 200, "{ready}");
    assert_eq!(
        (&ready["status"], &ready["status_message"]),
        (&json!("ready"), &json!("")),
        "{ready}"
    );
    eprintln!(
        "ready {:.1} s after a node could take it",
        added.elapsed().as_secs_f64()
    );
    let job = exec(&srv.url, &id, "echo placed").await;
    assert_eq!(
        (job["status"].as_str(), job["stdout"].as_str()),
        (Some("succeeded"), Some("placed\n")),
        "{job}"
    );
    delete(&srv.url, &id).await;
}

/// Two replicas over Redis share the cluster: a sandbox created through one runs jobs
/// through the other, a wait on one ends with a job the other accepted, and when the
/// replica running a job is killed the other delivers the job's real output from the
/// pod's agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_over_redis_share_the_cluster_and_take_over_a_dead_ones_job() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "replicas");
    let redis = crate::redis::RedisServer::start();
    let url = redis.url();
    let extra = ["--state", url.as_str(), "--worker-lease-s", "2"];
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = serve_with(&kc, &ns, da.path(), &extra);
    let b = serve_with(&kc, &ns, db.path(), &extra);

    let id = create_small(&a.url).await;
    let job = exec(&b.url, &id, "mkfifo /tmp/go-on; echo via-b").await;
    assert_eq!(job["stdout"], "via-b\n", "{job}");

    // A job accepted by A, waiting on a fifo; A dies while it runs in the pod.
    let (s, long) = call(
        reqwest::Method::POST,
        format!("{}/sandboxes/{id}/exec", a.url),
        Some(json!({"command": "read l < /tmp/go-on; echo \"taken $l\""})),
    )
    .await;
    assert_eq!(s, 200, "{long}");
    let long = long["job_id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (s, k) = call(
            reqwest::Method::GET,
            format!("{}/v1/sandboxes/{id}/exec/results/{long}", b.url),
            None,
        )
        .await;
        if s == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never ran: {s} {k}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.kill9();
    let (s, go) = call(
        reqwest::Method::POST,
        format!("{}/v1/sandboxes/{id}/exec", b.url),
        Some(json!({"command": ["sh", "-c", "echo on > /tmp/go-on"]})),
    )
    .await;
    assert_eq!(s, 200, "{go}");
    let (s, taken) = call(
        reqwest::Method::GET,
        format!("{}/jobs/{long}/wait?timeout=60", b.url),
        None,
    )
    .await;
    assert_eq!(s, 200, "{taken}");
    assert_eq!(
        (taken["status"].as_str(), taken["stdout"].as_str()),
        (Some("succeeded"), Some("taken on\n")),
        "{taken}"
    );

    delete(&b.url, &id).await;
    let left = ns.kubectl(&["get", "pods", "-l", "orchard.dev/sandbox", "-o", "name"]);
    assert_eq!(left, "", "delete leaves nothing");
}

/// The README's two commands: after `make cluster`, `orchard serve --backend kubernetes
/// --kubeconfig FILE` needs no other Kubernetes setting (its namespace, injector image
/// and the agents' ingress match the test cluster): a pod is created and runs commands
/// from this host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_command_needs_no_other_kubernetes_flag() {
    let kc = require_cluster!();
    let data = tempfile::tempdir().unwrap();
    let mut srv = ServerProcess::start(
        data.path(),
        &[
            "--backend",
            "kubernetes",
            "--kubeconfig",
            kc.to_str().unwrap(),
        ],
    );
    let id = create_small(&srv.url).await;
    let job = exec(&srv.url, &id, "echo bare").await;
    assert_eq!(
        (job["status"].as_str(), job["stdout"].as_str()),
        (Some("succeeded"), Some("bare\n")),
        "{job}"
    );
    delete(&srv.url, &id).await;
    assert!(srv.stop().success());
}

/// `GET /resources` on Kubernetes: the cluster's nodes with the capacity and allocatable
/// kubectl shows (from the server's node watch), and requested as this server's pods
/// request: nothing in a fresh namespace, a sandbox's request once it runs (its
/// container's 100m and 64Mi, larger than the injector's 50m and 32Mi), nothing again
/// once deleted. `/metrics` gives the same figures per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_report_every_node_and_what_this_servers_pods_request() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "resources");
    let data = tempfile::tempdir().unwrap();
    let srv = serve(&kc, &ns, data.path());
    let resources = || call(reqwest::Method::GET, format!("{}/resources", srv.url), None);
    let none = json!({"cpu": 0.0, "memory_bytes": 0});

    let (s, before) = resources().await;
    assert_eq!(s, 200, "{before}");
    assert!(
        before.get("message").is_none(),
        "the nodes are known: {before}"
    );
    let kube: Value = serde_json::from_str(&ns.kubectl(&["get", "nodes", "-o", "json"])).unwrap();
    let listed = kube["items"].as_array().unwrap();
    let nodes = before["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), listed.len(), "{before}");
    for k in listed {
        let name = k["metadata"]["name"].as_str().unwrap();
        let n = nodes.iter().find(|n| n["name"] == name).expect(name);
        for figure in ["capacity", "allocatable"] {
            let q = &k["status"][figure];
            let cpu = orchard::units::cpu_millis(q["cpu"].as_str().unwrap()).unwrap();
            let mem = orchard::units::bytes(q["memory"].as_str().unwrap()).unwrap();
            assert!(cpu > 0 && mem > 0, "{k}");
            assert_eq!(
                n[figure],
                json!({"cpu": cpu as f64 / 1000.0, "memory_bytes": mem}),
                "{n}"
            );
        }
        assert_eq!(
            n["requested"], none,
            "a fresh namespace requests nothing: {n}"
        );
    }
    assert_eq!(before["total_requested"], none);
    assert_eq!(before["available"], before["total_allocatable"]);

    let id = create_small(&srv.url).await;
    let (_, during) = resources().await;
    let request = json!({"cpu": 0.1, "memory_bytes": 64u64 << 20});
    assert_eq!(during["total_requested"], request, "{during}");
    let on = ns.kubectl(&[
        "get",
        "pod",
        "-l",
        &format!("orchard.dev/sandbox={id}"),
        "-o",
        "jsonpath={.items[0].spec.nodeName}",
    ]);
    let node = during["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == on.as_str())
        .unwrap_or_else(|| panic!("no node {on:?} in {during}"));
    assert_eq!(node["requested"], request, "{during}");
    let pods = during["sandbox_pods"].as_array().unwrap();
    assert_eq!(pods.len(), 1, "{during}");
    assert_eq!(pods[0]["name"], id.as_str());

    let metrics = reqwest::get(format!("{}/metrics", srv.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        format!("orchard_node_cpu_requested_cores{{node=\"{on}\"}} 0.1"),
        format!(
            "orchard_node_memory_requested_bytes{{node=\"{on}\"}} {}",
            64u64 << 20
        ),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
    let alloc = &node["allocatable"]["memory_bytes"];
    assert!(
        metrics
            .lines()
            .any(|l| l == format!("orchard_node_memory_allocatable_bytes{{node=\"{on}\"}} {alloc}")),
        "{metrics}"
    );

    // The delete returns once the pod is gone from the watch the figures come from.
    delete(&srv.url, &id).await;
    let (_, after) = resources().await;
    assert_eq!(after["total_requested"], none, "{after}");
}

//! `bench_kubernetes`: what a sandbox on the Kubernetes backend costs next to floors
//! measured in the same run, so noise and machine speed hit every series alike.
//!
//! Create: create-to-ready (the agent answers) of a cold busybox pod through
//! [`KubeBackend`], sequentially, next to the local backend's floor (`runc run` of
//! `true`, from `orchard_bench::local_backend`) and its own create of busybox.
//!
//! Exec `true`: straight to the agent on the pod IP, through `orchard serve --backend
//! kubernetes` (a real process) by `/v1/sandboxes/{id}/exec` and by the compatible
//! `POST /sandboxes/{id}/exec` with `wait=true`, next to the local backend's agent on its
//! Unix socket and a plain fork/exec of `true` on the host; interleaved call by call.
//!
//! Warm-pool claim: create-to-ready of a create that claims a warm busybox pod (a pool
//! of two, refilled between claims, the wait for a warm pod not counted). The exec
//! sandbox has a whole CPU, so CFS throttling of a 0.1-CPU pod does not become the
//! measure. Writes a Markdown table to `ORCHARD_BENCH_OUT` (default
//! `bench/results/kubernetes.md`); nothing about times is asserted. Run by
//! `tests/k8s/bench.sh` (in `make bench`); skipped without `ORCHARD_TEST_KUBECONFIG`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use orchard::backend::kubernetes::KubeBackend;
use orchard::backend::{AgentEndpoint, Backend, CreateSpec, SandboxImage};
use orchard_bench::local_backend as local_bench;
use orchard_client::AgentClient;
use orchard_protocol::{Command, ExecRequest};
use serde_json::{json, Value};

use super::{host_cidr, kube_config, require_cluster, TestNamespace};
use crate::util::bench::{out_path, pcts, post_json, Pcts};
use crate::util::sandbox::{busybox_image, fresh_root, test_config, TestBackend};
use crate::util::server::{send, ServerProcess, KEY};

/// The image of every sandbox here.
const BUSYBOX: &str = "docker.io/library/busybox:latest";
/// Sequential creates of a cold pod (each one deleted before the next).
const CREATE_ROUNDS: usize = 8;
/// Samples of the local floors (`runc run`, local create).
const FLOOR_ROUNDS: usize = 10;
/// Rounds of the exec series: one call of each route per round, the order rotating.
const EXEC_ROUNDS: usize = 300;
/// Warm-up calls per exec route.
const WARMUP: usize = 20;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The small pod every bench sandbox is (the node has 2 CPUs).
fn small_spec(id: &str) -> CreateSpec {
    CreateSpec {
        id: id.into(),
        image: SandboxImage::Reference(BUSYBOX.into()),
        cpus: Some(0.1),
        memory_bytes: Some(64 << 20),
        egress: false,
        env: Vec::new(),
        labels: Default::default(),
        ttl: Some(Duration::from_secs(600)),
        snapshot: None,
        progress: Default::default(),
    }
}

/// Create-to-ready and delete of cold busybox pods, one at a time, after one warm-up
/// (the injector image and busybox already on the node, as after a first sandbox).
async fn kube_creates(kc: &Path) -> (Pcts, Pcts) {
    let ns = TestNamespace::new(kc, "bench-create");
    let b = KubeBackend::connect(kube_config(kc, &ns)).await.unwrap();
    let warm = Backend::create(&b, small_spec("warm")).await.unwrap();
    Backend::delete(&b, &warm.id).await.unwrap();
    let (mut creates, mut deletes) = (Vec::new(), Vec::new());
    for i in 0..CREATE_ROUNDS {
        let t = Instant::now();
        let sb = Backend::create(&b, small_spec(&format!("cold-{i}")))
            .await
            .unwrap_or_else(|e| panic!("create {i}: {e}"));
        creates.push(ms(t.elapsed()));
        let t = Instant::now();
        Backend::delete(&b, &sb.id).await.unwrap();
        deletes.push(ms(t.elapsed()));
    }
    (pcts(&creates), pcts(&deletes))
}

/// Create-to-ready of creates that claim a warm pod: a pool of two busybox pods of the
/// same size as [`small_spec`]; before each create, the wait (not timed) for a warm pod
/// the keeper made running.
async fn kube_claims(kc: &Path) -> Pcts {
    let ns = TestNamespace::new(kc, "bench-claim");
    let mut cfg = kube_config(kc, &ns);
    cfg.warm_pools = vec![(BUSYBOX.into(), 2)];
    cfg.warm_cpus = Some(0.1);
    cfg.warm_memory_bytes = Some(64 << 20);
    let b = KubeBackend::connect(cfg).await.unwrap();
    let mut claims = Vec::new();
    for i in 0..CREATE_ROUNDS {
        let deadline = Instant::now() + Duration::from_secs(120);
        while super::pool::warm(&ns).is_empty() {
            assert!(Instant::now() < deadline, "no warm pod within 120 s");
            // The keeper refills on its own schedule.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let id = format!("claim-{i}");
        let t = Instant::now();
        let sb = Backend::create(&b, small_spec(&id)).await.unwrap();
        claims.push(ms(t.elapsed()));
        let pod = ns.kubectl(&[
            "get",
            "pods",
            "-l",
            &format!("orchard.dev/sandbox={id}"),
            "-o",
            "name",
        ]);
        assert!(
            pod.trim().starts_with("pod/pool-"),
            "create {i} did not claim: {pod}"
        );
        Backend::delete(&b, &sb.id).await.unwrap();
    }
    Backend::shutdown(&b).await.unwrap();
    pcts(&claims)
}

/// The local floors, one sample per run of the local backend's own bench (its `runc
/// run` floor is not public on its own; a run of one round gives one raw sample of
/// each): `runc run` of `true`, and the local create of busybox.
async fn local_floors(tb: &TestBackend) -> (Pcts, Pcts) {
    let cfg = local_bench::BenchConfig {
        rounds: 1,
        burst: 0,
        ..local_bench::BenchConfig::default()
    };
    let (mut runc, mut create) = (Vec::new(), Vec::new());
    for _ in 0..FLOOR_ROUNDS {
        let r = local_bench::run(&tb.backend, &busybox_image(), &cfg)
            .await
            .expect("the local backend's bench");
        runc.push(r.runc_run_ms.p50);
        create.push(r.create_ms.p50);
    }
    (pcts(&runc), pcts(&create))
}

/// One way to run `true`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Route {
    /// `std::process::Command::new("true")` on the host: fork/exec/wait alone.
    Host,
    /// The local backend's agent on its Unix socket.
    LocalDirect,
    /// The pod's agent on the pod IP, over TCP.
    PodDirect,
    /// `POST /v1/sandboxes/{id}/exec` `["true"]` on `orchard serve`.
    V1,
    /// `POST /sandboxes/{id}/exec` `"true"`, `wait=true` (a job running `sh -c true`).
    Compat,
}

const ROUTES: [Route; 5] = [
    Route::Host,
    Route::LocalDirect,
    Route::PodDirect,
    Route::V1,
    Route::Compat,
];

impl Route {
    fn label(self) -> &'static str {
        match self {
            Route::Host => "floor: fork/exec of `true` on the host",
            Route::LocalDirect => "local backend: agent on its Unix socket (floor)",
            Route::PodDirect => "kubernetes: agent on the pod IP (TCP)",
            Route::V1 => "kubernetes via `orchard serve`: `POST /v1/sandboxes/{id}/exec`",
            Route::Compat => {
                "kubernetes via `orchard serve`: `POST /sandboxes/{id}/exec`, `wait=true`"
            }
        }
    }
}

/// Clients of every route.
struct Targets {
    http: reqwest::Client,
    local: AgentClient,
    pod: AgentClient,
    url_v1: String,
    url_compat: String,
}

impl Targets {
    async fn post(&self, url: &str, body: &'static [u8]) -> Value {
        post_json(&self.http, url, body)
            .await
            .unwrap_or_else(|e| panic!("POST {url}: {e}"))
    }

    /// One call by `route`; panics unless `true` succeeded.
    async fn call(&self, route: Route) {
        let argv = ExecRequest {
            command: Command::Argv(vec!["true".into()]),
            ..Default::default()
        };
        let ok = match route {
            Route::Host => std::process::Command::new("true")
                .status()
                .expect("running true")
                .success(),
            Route::LocalDirect => self.local.exec(&argv).await.unwrap().exit_code == Some(0),
            Route::PodDirect => self.pod.exec(&argv).await.unwrap().exit_code == Some(0),
            Route::V1 => {
                let v = self.post(&self.url_v1, br#"{"command":["true"]}"#).await;
                v["exit_code"] == 0
            }
            Route::Compat => {
                let body = br#"{"command":"true","wait":true}"#;
                self.post(&self.url_compat, body).await["status"] == "succeeded"
            }
        };
        assert!(ok, "{route:?}: `true` did not succeed");
    }
}

/// Exec `true` by every route: warm-up, then rounds of one call each, rotating.
async fn exec_latency(t: &Targets) -> Vec<Pcts> {
    for _ in 0..WARMUP {
        for r in ROUTES {
            t.call(r).await;
        }
    }
    let mut samples = vec![Vec::new(); ROUTES.len()];
    for round in 0..EXEC_ROUNDS {
        for k in 0..ROUTES.len() {
            let i = (k + round) % ROUTES.len();
            let start = Instant::now();
            t.call(ROUTES[i]).await;
            samples[i].push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    samples.iter().map(|s| pcts(s)).collect()
}

/// `orchard serve --backend kubernetes` on this host, in `ns`, small default pods.
fn serve(kc: &Path, ns: &TestNamespace, data: &Path) -> ServerProcess {
    let cidr = host_cidr();
    ServerProcess::start(
        data,
        &[
            "--backend",
            "kubernetes",
            "--kubeconfig",
            kc.to_str().unwrap(),
            "--namespace",
            &ns.name,
            "--kube-ingress-cidr",
            &cidr,
            "--kube-grace-period-s",
            "0",
            "--default-cpu",
            "1",
            "--default-memory",
            "128Mi",
        ],
    )
}

/// A ready busybox sandbox made through the server's `/v1`: its id and a client of its
/// agent on the pod IP (the URL and token `/v1` answers).
async fn server_sandbox(url: &str) -> (String, AgentClient) {
    let http = reqwest::Client::new();
    let (s, sb) = send(
        http.post(format!("{url}/v1/sandboxes"))
            .header("X-API-Key", KEY)
            .json(&json!({"image": "busybox:latest", "cpu": "1", "memory": "128Mi"})),
    )
    .await;
    assert_eq!(s, 201, "{sb}");
    let id = sb["id"].as_str().unwrap().to_string();
    let (s, v) = send(
        http.get(format!("{url}/v1/sandboxes/{id}"))
            .header("X-API-Key", KEY),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let endpoint = AgentEndpoint::parse_url(v["agent"]["url"].as_str().unwrap()).unwrap();
    let token = v["agent"]["token"].as_str().unwrap();
    (id, AgentClient::new(endpoint.client(), token))
}

/// The CFS counters of the pod's CPU cgroup (v1 or v2), as `nr_throttled of
/// nr_periods periods throttled`.
async fn cpu_throttling(pod: &AgentClient) -> String {
    let r = pod
        .exec(&ExecRequest {
            command: Command::Shell(
                "cat /sys/fs/cgroup/cpu/cpu.stat 2>/dev/null || cat /sys/fs/cgroup/cpu.stat".into(),
            ),
            ..Default::default()
        })
        .await
        .expect("reading the pod's cpu.stat");
    let text = r.stdout.text_lossy();
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    format!(
        "{} of {} periods throttled",
        field("nr_throttled "),
        field("nr_periods ")
    )
}

/// The results.
struct Report {
    runc: Pcts,
    local_create: Pcts,
    kube_create: Pcts,
    kube_delete: Pcts,
    kube_claim: Pcts,
    exec: Vec<Pcts>,
    /// The pod's CFS counters after the exec series (`nr_periods`, `nr_throttled`).
    pod_throttling: String,
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "–".into()
    }
}

impl Report {
    fn create_table(&self, md: &mut String) {
        let floor = self.runc.p50;
        let _ = writeln!(
            md,
            "| measure | n | p50 ms | p90 ms | vs `runc run` (p50) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|");
        let rows = [
            (
                "floor: `runc run` of `true` (local backend's bench)",
                self.runc,
            ),
            ("local backend: create to ready, busybox", self.local_create),
            (
                "kubernetes: create to ready, cold busybox pod",
                self.kube_create,
            ),
            (
                "kubernetes: delete (until the pod is gone)",
                self.kube_delete,
            ),
        ];
        for (label, p) in rows {
            let _ = writeln!(md, "| {label} | {} | {} |", p.cells(1), ratio(p.p50, floor));
        }
        let p = self.kube_claim;
        let _ = writeln!(
            md,
            "| kubernetes: create to ready, warm-pool claim | {} | {} |",
            p.cells(1),
            ratio(p.p50, floor)
        );
    }

    fn exec_table(&self, md: &mut String) {
        let at = |r: Route| self.exec[ROUTES.iter().position(|x| *x == r).unwrap()];
        let (local, pod) = (at(Route::LocalDirect).p50, at(Route::PodDirect).p50);
        let _ = writeln!(
            md,
            "| exec `true` | n | p50 µs | p90 µs | vs local direct (p50) | vs pod-IP direct (p50) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        for r in ROUTES {
            let p = at(r);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                r.label(),
                p.cells(0),
                ratio(p.p50, local),
                ratio(p.p50, pod),
            );
        }
    }

    fn to_markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# Kubernetes backend benchmark\n");
        let _ = writeln!(
            md,
            "The test cluster of `tests/k8s/` (one node, 2 CPUs); every floor measured in \
             the same run. Create: {CREATE_ROUNDS} sequential creates of a busybox pod of \
             100m CPU and 64 MiB (injector and busybox images on the node, one warm-up \
             create first), each deleted before the next; the warm-pool claims come from \
             a pool of two such pods, refilled between claims (the wait for a warm pod \
             is not timed); the local floors are {FLOOR_ROUNDS} one-round runs of the \
             local backend's bench.\n"
        );
        self.create_table(&mut md);
        let _ = writeln!(
            md,
            "\nExec: {EXEC_ROUNDS} calls per route after {WARMUP} warm-up calls, \
             interleaved call by call (the order rotates every round), keep-alive \
             clients, one sandbox per backend (the pod: 1 CPU, 128 MiB); the server is `orchard serve --backend \
             kubernetes` on this host (its request log to a file), the compatible route \
             runs `sh -c true` as a job.\n"
        );
        self.exec_table(&mut md);
        let _ = writeln!(
            md,
            "\nThe exec pod's CFS counters after the series: {}. With a 0.1-CPU pod nearly \
             every period was throttled and the p90 of the pod-IP and compatible routes \
             was 75-80 ms (a call landing in a throttled period waits for the next one); \
             the exec pod has a whole CPU so that the table measures the path, not the \
             limit.",
            self.pod_throttling
        );
        md
    }
}

/// `make bench` runs it through `tests/k8s/bench.sh`; by hand, with the cluster up:
/// `ORCHARD_TEST_KUBECONFIG=tests/k8s/.run/kubeconfig cargo test --release -p orchard
/// --test integration bench_kubernetes -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run by make bench"]
async fn bench_kubernetes() {
    let kc = require_cluster!();
    orchard_test_support::require_runc!();
    let mut config = test_config(&fresh_root());
    config.ready_timeout = Duration::from_secs(120);
    let local = TestBackend::with_config(config);

    let (runc, local_create) = local_floors(&local).await;
    let (kube_create, kube_delete) = kube_creates(&kc).await;
    let kube_claim = kube_claims(&kc).await;

    let ns = TestNamespace::new(&kc, "bench-exec");
    let data = tempfile::tempdir().unwrap();
    let srv = serve(&kc, &ns, data.path());
    let (id, pod) = server_sandbox(&srv.url).await;
    let local_sb = local.busybox().await;
    let targets = Targets {
        http: reqwest::Client::new(),
        local: local_sb.client(),
        pod,
        url_v1: format!("{}/v1/sandboxes/{id}/exec", srv.url),
        url_compat: format!("{}/sandboxes/{id}/exec", srv.url),
    };
    let exec = exec_latency(&targets).await;
    let pod_throttling = cpu_throttling(&targets.pod).await;
    let (s, v) = send(
        targets
            .http
            .delete(format!("{}/v1/sandboxes/{id}", srv.url))
            .header("X-API-Key", KEY),
    )
    .await;
    assert!(s < 300, "deleting {id}: {s} {v}");
    drop(srv);
    local.finish().await;

    let report = Report {
        runc,
        local_create,
        kube_create,
        kube_delete,
        kube_claim,
        exec,
        pod_throttling,
    };
    let md = report.to_markdown();
    println!("{md}");
    let out = out_path("kubernetes.md");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).expect("creating the results directory");
    }
    std::fs::write(&out, &md).expect("writing the benchmark table");
    println!("wrote {}", out.display());
}

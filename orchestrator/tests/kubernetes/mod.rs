//! The Kubernetes backend on a real cluster: the test cluster of `tests/k8s/`
//! (`make cluster`), run by `tests/k8s/backend.sh` in `make test`, which sets
//! `ORCHARD_TEST_KUBECONFIG` (and `ORCHARD_REQUIRE_K8S=1`, so a missing cluster fails
//! instead of skipping). Without it these tests print `skipped` and pass.
//!
//! Each test works in a namespace of its own (removed when it ends), so tests run in
//! parallel and a failed one leaves nothing in the next one's way.

mod bench;
mod pool;
mod server;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command as Process;
use std::sync::Arc;
use std::time::Duration;

use orchard::backend::kubernetes::{KubeBackend, KubeConfig};
use orchard::backend::{
    Backend, BackendError, BackendSandbox, CreateSpec, SandboxImage, StartProgress,
};
use orchard_client::AgentClient;
use orchard_protocol::{Command, ExecRequest};

/// The test cluster's kubeconfig, or `None` (the test is skipped) unless the run
/// requires a cluster.
pub fn kubeconfig() -> Option<PathBuf> {
    match std::env::var_os("ORCHARD_TEST_KUBECONFIG") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var("ORCHARD_REQUIRE_K8S").as_deref() == Ok("1") => {
            panic!("ORCHARD_REQUIRE_K8S=1 but ORCHARD_TEST_KUBECONFIG is not set")
        }
        None => None,
    }
}

/// Returns from the test, printing why, when there is no test cluster.
macro_rules! require_cluster {
    () => {
        match $crate::kubernetes::kubeconfig() {
            Some(k) => k,
            None => {
                eprintln!("skipped: needs the test cluster (tests/k8s/backend.sh)");
                return;
            }
        }
    };
}
pub(crate) use require_cluster;

/// A namespace of the test's own; deleted (without waiting) when dropped.
pub struct TestNamespace {
    /// Its name.
    pub name: String,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    /// A fresh name; the backend makes the namespace.
    pub fn new(kubeconfig: &std::path::Path, what: &str) -> TestNamespace {
        let n = crate::util::sandbox::unique_id(what).replace('_', "-");
        TestNamespace {
            name: format!("t-{n}").chars().take(63).collect(),
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// `kubectl` on the test cluster in this namespace; its stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = Process::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["-n", &self.name])
            .args(args)
            .output()
            .expect("running kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let _ = Process::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "delete",
                "namespace",
                &self.name,
                "--wait=false",
                "--ignore-not-found",
            ])
            .output();
    }
}

/// Capacity a test adds while its creates wait: sandbox pods get a node selector
/// (`capacity.orchard-test/<the test's namespace>=true`) that no node matches until
/// [`Capacity::add`] labels the cluster's nodes with it, as if a node had joined. The
/// key is the test's own, so only its pods are affected and tests running beside it on
/// the one node are not. The label is removed when this is dropped.
pub struct Capacity {
    kubeconfig: PathBuf,
    key: String,
}

impl Capacity {
    /// Capacity for the pods of `ns` (not added yet).
    pub fn for_test(kubeconfig: &std::path::Path, ns: &TestNamespace) -> Capacity {
        Capacity {
            kubeconfig: kubeconfig.to_path_buf(),
            key: format!("capacity.orchard-test/{}", ns.name),
        }
    }

    /// The node selector of the pods that wait for it.
    pub fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(self.key.clone(), "true".to_string())])
    }

    fn label_nodes(&self, label: &str) -> std::process::Output {
        Process::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["label", "nodes", "--all", "--overwrite", label])
            .output()
            .expect("running kubectl")
    }

    /// Labels every node: the waiting pods can be scheduled.
    pub fn add(&self) {
        let out = self.label_nodes(&format!("{}=true", self.key));
        assert!(
            out.status.success(),
            "labelling the nodes: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Capacity {
    fn drop(&mut self) {
        let _ = self.label_nodes(&format!("{}-", self.key));
    }
}

/// The address this host reaches pods from (the test cluster's node IP), allowed to
/// reach agents.
pub fn host_cidr() -> String {
    std::env::var("ORCHARD_TEST_KUBE_HOST_CIDR").unwrap_or_else(|_| "198.18.0.1/32".into())
}

/// The backend's settings for `ns`.
pub fn kube_config(kubeconfig: &std::path::Path, ns: &TestNamespace) -> KubeConfig {
    KubeConfig {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        namespace: ns.name.clone(),
        grace_period_s: 0,
        ingress_cidrs: vec![host_cidr()],
        // The node (198.18.0.1, a reserved range egress is refused by default) is what
        // the egress test probes: the operator allows it here.
        egress: orchard::egress::EgressPolicy::parse(&[host_cidr()]).unwrap(),
        ..KubeConfig::default()
    }
}

/// What to create.
pub fn spec(id: &str, image: &str) -> CreateSpec {
    CreateSpec {
        id: id.into(),
        image: SandboxImage::Reference(image.into()),
        // Small: the test node has 2 CPUs, shared by the tests running at once.
        cpus: Some(0.1),
        memory_bytes: Some(128 << 20),
        egress: false,
        env: vec!["GREETING=hello from k8s".into()],
        labels: BTreeMap::from([("orchard.tenant".to_string(), "test".to_string())]),
        ttl: Some(Duration::from_secs(600)),
        snapshot: None,
        progress: Default::default(),
    }
}

fn client(sb: &BackendSandbox) -> AgentClient {
    AgentClient::new(sb.agent.client(), sb.token.clone())
}

async fn run(sb: &BackendSandbox, command: Command) -> (Option<i32>, String, String) {
    let r = client(sb)
        .exec(&ExecRequest {
            command,
            timeout_ms: Some(60_000),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("exec in {}: {e}", sb.id));
    (r.exit_code, r.stdout.text_lossy(), r.stderr.text_lossy())
}

/// Pods, Secrets and per-sandbox policies left in the namespace.
fn leftovers(ns: &TestNamespace) -> String {
    ns.kubectl(&[
        "get",
        "pods,secrets,networkpolicies",
        "-l",
        "orchard.dev/sandbox",
        "-o",
        "name",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busybox_python_and_an_image_with_no_shell_all_run_the_injected_agent() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "images");
    let b = KubeBackend::connect(kube_config(&kc, &ns)).await.unwrap();
    let (bb, py, empty) = tokio::join!(
        Backend::create(&b, spec("bb", "docker.io/library/busybox:latest")),
        Backend::create(&b, spec("py", "docker.io/library/python:3.11-slim")),
        Backend::create(&b, spec("empty", "docker.io/library/empty:latest")),
    );
    let (bb, py, empty) = (bb.unwrap(), py.unwrap(), empty.unwrap());
    assert!(bb.agent.to_string().starts_with("http://"), "{}", bb.agent);

    let (code, out, err) = run(
        &bb,
        Command::Shell(
            "echo $GREETING; id -u; cat /proc/1/cmdline | tr '\\0' ' '; echo; \
             env -i /bin/cat /proc/1/environ | tr '\\0' '\\n' | grep -c -e ^PATH= -e ^GREETING=; \
             env -i /bin/cat /proc/1/environ | grep -c ORCHARD_AGENT_ || true"
                .into(),
        ),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "hello from k8s");
    // PID 1 is the agent's init (the agent runs beside it, protected): readable, with
    // the container's environment and none of the agent's variables (issue 31).
    assert!(
        lines[2].starts_with("/.orchard/bin/orchard-agent --pid1-init"),
        "the agent's init is PID 1: {out}"
    );
    assert_eq!(lines[3], "2", "PATH and GREETING in /proc/1/environ: {out}");
    assert_eq!(lines[4], "0", "no agent variable in /proc/1/environ: {out}");
    let (code, out, err) = run(
        &bb,
        Command::Shell("env | grep -c ORCHARD_AGENT_TOKEN; touch /.orchard/x".into()),
    )
    .await;
    assert_ne!(
        code,
        Some(0),
        "the injected volume is read-only: {out} {err}"
    );
    assert!(
        out.starts_with('0'),
        "the token is not in commands' environment: {out}"
    );

    let (code, out, err) = run(
        &py,
        Command::Argv(vec!["python3".into(), "-c".into(), "print(2+2)".into()]),
    )
    .await;
    assert_eq!((code, out.as_str()), (Some(0), "4\n"), "{err}");

    // The runtime's files (issue 31), as the kubelet and containerd give them: localhost
    // and the pod's own name in /etc/hosts, /etc/hostname, HOSTNAME for what the agent
    // starts; names resolve from Python.
    let (code, out, err) = run(
        &bb,
        Command::Shell(
            "grep -c localhost /etc/hosts; h=$(cat /etc/hostname); echo $h; echo $HOSTNAME; \
             grep -c \"$h\" /etc/hosts"
                .into(),
        ),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let l: Vec<&str> = out.lines().collect();
    assert!(l[0].parse::<u32>().unwrap_or(0) >= 1, "localhost: {out}");
    assert!(
        !l[1].is_empty() && l[1] == l[2],
        "/etc/hostname and HOSTNAME: {out}"
    );
    assert!(
        l[3].parse::<u32>().unwrap_or(0) >= 1,
        "the pod's name in /etc/hosts: {out}"
    );
    let probe = "import socket; socket.getaddrinfo('localhost', 80); \
                 print(bool(socket.gethostbyname(socket.gethostname())))";
    let (code, out, err) = run(
        &py,
        Command::Argv(vec!["python3".into(), "-c".into(), probe.into()]),
    )
    .await;
    assert_eq!((code, out.as_str()), (Some(0), "True\n"), "{err}");

    // No shell, no libc: the agent still serves commands and files.
    let (code, out, _) = run(
        &empty,
        Command::Argv(vec![
            "/.orchard/bin/orchard-agent".into(),
            "--version".into(),
        ]),
    )
    .await;
    assert_eq!(code, Some(0));
    assert!(out.contains("orchard-agent"), "{out}");
    let c = client(&empty);
    c.write_file("/note.txt", "kept", None).await.unwrap();
    assert_eq!(&c.read_file("/note.txt").await.unwrap()[..], b"kept");

    // A wrong token is refused by the agent on the pod IP.
    let wrong = AgentClient::new(bb.agent.client(), "not-the-token");
    assert!(wrong
        .exec(&ExecRequest {
            command: Command::Shell("true".into()),
            ..Default::default()
        })
        .await
        .is_err());

    let listed = Backend::list(&b).await.unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed
        .iter()
        .all(|s| s.liveness == orchard::backend::Liveness::Running && !s.token.is_empty()));
    assert_eq!(
        listed.iter().find(|s| s.id == "py").unwrap().token,
        py.token
    );
    for id in ["bb", "py", "empty"] {
        Backend::delete(&b, id).await.unwrap();
    }
    assert!(matches!(
        Backend::delete(&b, "bb").await,
        Err(BackendError::NotFound(_))
    ));
    assert_eq!(leftovers(&ns), "", "delete leaves nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_be_pulled_fails_with_kubernetes_reason_and_leaves_nothing() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "pull");
    let b = KubeBackend::connect(kube_config(&kc, &ns)).await.unwrap();
    let err = Backend::create(&b, spec("nopull", "127.0.0.1:1/nothing/here:1"))
        .await
        .unwrap_err();
    let m = err.to_string();
    assert!(
        m.contains("127.0.0.1:1/nothing/here:1") && m.contains("ErrImagePull"),
        "{m}"
    );
    assert_eq!(leftovers(&ns), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_no_node_can_take_waits_as_unschedulable_and_runs_once_a_node_can() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "sched");
    let capacity = Capacity::for_test(&kc, &ns);
    let mut cfg = kube_config(&kc, &ns);
    cfg.node_selector = capacity.selector();
    let b = KubeBackend::connect(cfg).await.unwrap();
    let (progress, mut waiting) = StartProgress::channel();
    let mut s = spec("waits", "docker.io/library/busybox:latest");
    s.progress = progress;
    let create = Backend::create(&b, s);
    tokio::pin!(create);

    let why = tokio::select! {
        r = &mut create => panic!("the create ended while no node could take its pod: {r:?}"),
        r = tokio::time::timeout(Duration::from_secs(60), waiting.wait_for(Option::is_some)) => {
            r.expect("reported unschedulable within 60 s").unwrap().clone().unwrap_or_default()
        }
    };
    assert!(
        why.contains("didn't match Pod's node affinity/selector"),
        "the scheduler's reason: {why}"
    );
    // It waits: a scheduler retry or two later, still no failure.
    tokio::select! {
        r = &mut create => panic!("the create ended while no node could take its pod: {r:?}"),
        () = tokio::time::sleep(Duration::from_secs(3)) => {}
    }

    let added = std::time::Instant::now();
    capacity.add();
    let sb = tokio::time::timeout(Duration::from_secs(120), create)
        .await
        .expect("ready within 120 s of a node matching")
        .unwrap();
    eprintln!(
        "ready {:.1} s after the node could take it",
        added.elapsed().as_secs_f64()
    );
    assert_eq!(
        *waiting.borrow(),
        None,
        "scheduled: no longer unschedulable"
    );
    let (code, out, err) = run(&sb, Command::Shell("echo $GREETING".into())).await;
    assert_eq!((code, out.as_str()), (Some(0), "hello from k8s\n"), "{err}");
    Backend::delete(&b, "waits").await.unwrap();
    assert_eq!(leftovers(&ns), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_behind_our_back_is_gone_with_its_secret() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "behind");
    let b = Arc::new(KubeBackend::connect(kube_config(&kc, &ns)).await.unwrap());
    let sb = Backend::create(&*b, spec("lost", "docker.io/library/busybox:latest"))
        .await
        .unwrap();
    ns.kubectl(&["delete", "pod", "lost", "--grace-period=0", "--wait=true"]);
    // The watch saw it go; the garbage collector removes the Secret it owned.
    let listed = Backend::list(&*b).await.unwrap();
    assert!(listed.iter().all(|s| s.id != sb.id), "{listed:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !leftovers(&ns).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the Secret outlived its pod: {}",
            leftovers(&ns)
        );
        // Kubernetes' garbage collector works on its own schedule: nothing to wait on.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(matches!(
        Backend::delete(&*b, "lost").await,
        Err(BackendError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_is_denied_unless_asked_for() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "egress");
    let b = KubeBackend::connect(kube_config(&kc, &ns)).await.unwrap();
    let mut open = spec("open", "docker.io/library/busybox:latest");
    open.egress = true;
    let (closed, open) = tokio::join!(
        Backend::create(&b, spec("closed", "docker.io/library/busybox:latest")),
        Backend::create(&b, open),
    );
    let (closed, open) = (closed.unwrap(), open.unwrap());
    let policies = ns.kubectl(&["get", "networkpolicies", "-o", "name"]);
    for p in [
        "orchard-deny-egress",
        "orchard-agent-ingress",
        "open-egress",
    ] {
        assert!(policies.contains(p), "{p} missing: {policies}");
    }
    assert!(!policies.contains("closed-egress"), "{policies}");
    // The API server on the node: reachable only by the sandbox allowed egress.
    let target = host_cidr().split('/').next().unwrap().to_string();
    let probe = format!("echo | nc -w 3 {target} 6443 >/dev/null && echo open || echo closed");
    // The network plugin (kube-router here) applies policies to a new pod within
    // seconds, on its own schedule: the sandbox allowed egress gets it within 30 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, out_open, _) = run(&open, Command::Shell(probe.clone())).await;
        if out_open.trim() == "open" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "egress never opened: {out_open}"
        );
    }
    let (_, out_closed, _) = run(&closed, Command::Shell(probe)).await;
    assert_eq!(
        out_closed.trim(),
        "closed",
        "egress denied by the namespace policy"
    );
    Backend::delete(&b, "open").await.unwrap();
    Backend::delete(&b, "closed").await.unwrap();
    assert_eq!(leftovers(&ns), "");
}

//! kube-rs mock API tests: the error paths a real cluster cannot produce on demand (an
//! API server refusing or failing a call, a watch that expires and must re-list). The
//! client is kube's own, over a `tower::service_fn` answering like the API server; the
//! real cluster tests are in `orchestrator/tests/kubernetes`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{Method, Request, Response, StatusCode};
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use kube::Client;
use serde_json::{json, Value};

use super::*;
use crate::backend::SandboxImage;

type MockBody = UnsyncBoxBody<Bytes, std::io::Error>;

const NS: &str = "orchard-mock";

fn full(code: u16, v: Value) -> Response<MockBody> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(v.to_string()))
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
        .unwrap()
}

/// A body that sends `lines` (watch events), then what `live` brings while the test
/// runs, then stays open like a quiet watch.
fn stream(
    lines: Vec<Value>,
    live: Option<tokio::sync::mpsc::UnboundedReceiver<Value>>,
) -> Response<MockBody> {
    let later = futures_util::stream::unfold(live, |live| async move {
        let mut rx = live?;
        let l = rx.recv().await?;
        Some((l, Some(rx)))
    });
    let frames = futures_util::stream::iter(lines)
        .chain(later)
        .map(|l| Ok(Frame::data(Bytes::from(format!("{l}\n")))))
        .chain(futures_util::stream::pending());
    Response::builder()
        .status(200)
        .body(StreamBody::new(frames).boxed_unsync())
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
           "reason": reason, "message": message})
}

fn pod_json(name: &str, rv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                        "resourceVersion": rv,
                        "labels": {objects::MANAGED_BY: objects::MANAGED_BY_VALUE,
                                   SANDBOX_LABEL: name},
                        "annotations": {objects::LABELS_ANNOTATION: "{\"orchard.tenant\":\"t\"}",
                                        objects::IMAGE_ANNOTATION: "docker.io/library/busybox:latest"}},
           "spec": {"containers": [{"name": objects::SANDBOX_CONTAINER, "image": "busybox"}]},
           "status": {"phase": "Running", "podIP": "10.0.0.9",
                      "containerStatuses": [{"name": objects::SANDBOX_CONTAINER, "image": "busybox",
                                             "imageID": "", "ready": true, "restartCount": 0,
                                             "state": {"running": {}}}]}})
}

fn node_json(name: &str, cpu: &str, memory: &str, rv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "resourceVersion": rv},
           "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                      "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}}})
}

/// Sandbox pod `name` bound to `node`, requesting `cpu` and `memory`.
fn bound_pod_json(name: &str, node: &str, cpu: &str, memory: &str) -> Value {
    let mut p = pod_json(name, "9");
    p["spec"]["nodeName"] = json!(node);
    p["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": cpu, "memory": memory}, "requests": {"cpu": cpu, "memory": memory}});
    p
}

/// What the mock saw and how it answers the calls a test varies.
#[derive(Default)]
struct Script {
    /// `METHOD path` of every call.
    calls: Vec<String>,
    /// Pods each list returns, one entry per list (the last repeats).
    lists: Vec<Vec<Value>>,
    lists_done: usize,
    /// Events of each watch, one entry per watch (the last repeats).
    watches: Vec<Vec<Value>>,
    watches_done: usize,
    /// Events the first watch sends when the test sends them, after its `watches`.
    live: Option<tokio::sync::mpsc::UnboundedReceiver<Value>>,
    /// Answers to `POST .../pods` and `POST .../secrets`.
    pod_create: Option<(u16, Value)>,
    secret_create: Option<(u16, Value)>,
    /// Events of the node watch, after its list.
    node_watch: Vec<Value>,
    /// Every node call is refused, as without RBAC for nodes.
    nodes_forbidden: bool,
}

fn answer(script: &Arc<Mutex<Script>>, req: &Request<kube::client::Body>) -> Response<MockBody> {
    let mut s = script.lock().unwrap();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    s.calls.push(format!("{} {path}", req.method()));
    let pods = format!("/api/v1/namespaces/{NS}/pods");
    let secrets = format!("/api/v1/namespaces/{NS}/secrets");
    match (req.method().clone(), path.as_str()) {
        (Method::GET, p) if p == format!("/api/v1/namespaces/{NS}") => full(
            200,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
        ),
        (Method::PATCH, p) if p.contains("/networkpolicies/") => full(
            200,
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                   "metadata": {"name": p.rsplit('/').next().unwrap(), "namespace": NS}}),
        ),
        (Method::GET, "/api/v1/nodes") if s.nodes_forbidden => full(
            403,
            status(
                403,
                "Forbidden",
                "nodes is forbidden: User \"system:serviceaccount:orchard-system:orchard\" \
                 cannot list resource \"nodes\" in API group \"\" at the cluster scope",
            ),
        ),
        (Method::GET, "/api/v1/nodes") if query.contains("watch=true") => {
            stream(s.node_watch.clone(), None)
        }
        (Method::GET, "/api/v1/nodes") => full(
            200,
            json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "5"}, "items": [
                node_json("n1", "1900m", "8Gi", "3"), node_json("n2", "4", "2048Mi", "4")]}),
        ),
        (Method::GET, p) if p == pods && query.contains("watch=true") => {
            let i = s.watches_done.min(s.watches.len().saturating_sub(1));
            s.watches_done += 1;
            let live = s.live.take();
            stream(s.watches.get(i).cloned().unwrap_or_default(), live)
        }
        (Method::GET, p) if p == pods => {
            let i = s.lists_done.min(s.lists.len().saturating_sub(1));
            s.lists_done += 1;
            let items = s.lists.get(i).cloned().unwrap_or_default();
            let rv = format!("{}", 10 + s.lists_done);
            full(
                200,
                json!({"apiVersion": "v1", "kind": "PodList",
                             "metadata": {"resourceVersion": rv}, "items": items}),
            )
        }
        (Method::GET, p) if p == secrets => full(
            200,
            json!({"apiVersion": "v1", "kind": "SecretList", "metadata": {}, "items": [
                {"metadata": {"name": "sb-late-token", "labels": {SANDBOX_LABEL: "sb-late"}},
                 "data": {"token": "dG9rZW4="}}]}),
        ),
        (Method::POST, p) if p == secrets => match s.secret_create.clone() {
            Some((code, v)) => full(code, v),
            None => full(
                201,
                json!({"apiVersion": "v1", "kind": "Secret",
                                    "metadata": {"name": "x", "namespace": NS}}),
            ),
        },
        (Method::POST, p) if p == pods => match s.pod_create.clone() {
            Some((code, v)) => full(code, v),
            None => full(500, status(500, "InternalError", "no pod script")),
        },
        (Method::DELETE, _) => full(200, status(200, "", "")),
        _ => full(404, status(404, "NotFound", "not in the mock")),
    }
}

fn client(script: &Arc<Mutex<Script>>) -> Client {
    let script = script.clone();
    let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
        let r = answer(&script, &req);
        async move { Ok::<_, std::convert::Infallible>(r) }
    });
    Client::new(svc, NS)
}

fn cfg() -> KubeConfig {
    KubeConfig {
        namespace: NS.into(),
        ..KubeConfig::default()
    }
}

fn spec(id: &str) -> CreateSpec {
    CreateSpec {
        id: id.into(),
        image: SandboxImage::Reference("docker.io/library/busybox:latest".into()),
        cpus: Some(1.0),
        memory_bytes: Some(64 << 20),
        egress: false,
        env: vec![],
        labels: BTreeMap::new(),
        ttl: None,
        snapshot: None,
        progress: Default::default(),
    }
}

#[tokio::test]
async fn capacity_is_the_largest_nodes_allocatable() {
    let script = Arc::new(Mutex::new(Script::default()));
    let b = KubeBackend::start(client(&script), cfg()).await.unwrap();
    let c = b.capacity().unwrap();
    assert_eq!(c.cpus, 4.0);
    assert_eq!(c.memory_bytes, 8 << 30);
    let calls = script.lock().unwrap().calls.clone();
    assert!(
        calls
            .iter()
            .filter(|c| c.contains("/networkpolicies/"))
            .count()
            == 2,
        "both namespace policies are applied: {calls:?}"
    );
}

#[tokio::test]
async fn a_failing_pod_create_removes_the_secret_and_is_unavailable() {
    let script = Arc::new(Mutex::new(Script {
        pod_create: Some((500, status(500, "InternalError", "etcd is down"))),
        ..Script::default()
    }));
    let b = KubeBackend::start(client(&script), cfg()).await.unwrap();
    let err = Backend::create(&b, spec("sb-1")).await.unwrap_err();
    assert!(matches!(err, BackendError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("etcd is down"), "{err}");
    let calls = script.lock().unwrap().calls.clone();
    assert!(
        calls
            .iter()
            .any(|c| c == &format!("DELETE /api/v1/namespaces/{NS}/secrets/sb-1-token")),
        "the secret made for the pod is removed: {calls:?}"
    );
}

#[tokio::test]
async fn a_forbidden_call_names_the_missing_permission() {
    let script = Arc::new(Mutex::new(Script {
        secret_create: Some((
            403,
            status(403, "Forbidden", "secrets is forbidden: User cannot create"),
        )),
        ..Script::default()
    }));
    let b = KubeBackend::start(client(&script), cfg()).await.unwrap();
    let err = Backend::create(&b, spec("sb-1")).await.unwrap_err();
    let BackendError::Failed { message: m, .. } = err else {
        panic!("{err:?}")
    };
    assert!(m.contains("forbidden") && m.contains("rbac"), "{m}");
    let calls = script.lock().unwrap().calls.clone();
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("POST") && c.ends_with("/pods")),
        "no pod without its secret: {calls:?}"
    );
}

#[tokio::test]
async fn an_invalid_spec_is_refused_before_any_call() {
    let script = Arc::new(Mutex::new(Script::default()));
    let b = KubeBackend::start(client(&script), cfg()).await.unwrap();
    let before = script.lock().unwrap().calls.len();
    let err = Backend::create(&b, spec("has_underscore"))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::Invalid { .. }), "{err:?}");
    assert_eq!(script.lock().unwrap().calls.len(), before);
}

#[tokio::test]
async fn an_expired_watch_relists_and_sees_what_changed_meanwhile() {
    let gone =
        json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")});
    let script = Arc::new(Mutex::new(Script {
        lists: vec![vec![], vec![pod_json("sb-late", "20")]],
        watches: vec![vec![gone], vec![]],
        ..Script::default()
    }));
    let b = KubeBackend::start(client(&script), cfg()).await.unwrap();
    let seen = tokio::time::timeout(
        Duration::from_secs(20),
        b.watch.wait_for("sb-late", |p| p.map(|_| ())),
    )
    .await;
    assert!(seen.is_ok(), "the re-list after the 410 brought the pod in");
    let list = Backend::list(&b).await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].id, "sb-late");
    assert_eq!(list[0].token, "token");
    assert_eq!(list[0].liveness, crate::backend::Liveness::Running);
    assert_eq!(list[0].labels["orchard.tenant"], "t");
    assert_eq!(list[0].agent.to_string(), "http://10.0.0.9:7070");
    assert!(script.lock().unwrap().lists_done >= 2);
}

/// Pause, snapshots and forks are not built on Kubernetes yet: each answers
/// `Unsupported` (501 at the API) naming the design, before any call to the cluster.
#[tokio::test]
async fn pause_snapshots_and_forks_are_refused_as_not_built_yet() {
    let script = Arc::new(Mutex::new(Script::default()));
    let b = KubeBackend::start(client(&script), cfg()).await.unwrap();
    let before = script.lock().unwrap().calls.len();
    let mut fork = spec("sb-fork");
    fork.snapshot = Some("snap-00000000000000000000".into());
    let errors = [
        Backend::create(&b, fork).await.unwrap_err(),
        Backend::pause(&b, "sb-1").await.unwrap_err(),
        Backend::resume(&b, "sb-1").await.unwrap_err(),
        Backend::snapshot(&b, crate::backend::SnapshotSpec::default())
            .await
            .unwrap_err(),
    ];
    for e in errors {
        assert!(
            matches!(&e, BackendError::Unsupported(m) if m.contains("docs/snapshots-kubernetes.md")),
            "{e:?}"
        );
    }
    assert!(Backend::snapshots(&b).await.unwrap().is_empty());
    assert_eq!(script.lock().unwrap().calls.len(), before);
}

/// `nodes` answers from the two watches: each node's figures, what the backend's pods on
/// it request, a change the node watch brings; and no API call per answer.
#[tokio::test]
async fn nodes_come_from_the_watches_with_no_call_per_answer() {
    let mut grown = node_json("n2", "6", "4Gi", "6");
    grown["status"]["capacity"]["cpu"] = json!("8");
    let script = Arc::new(Mutex::new(Script {
        lists: vec![vec![
            bound_pod_json("sb-1", "n1", "250m", "256Mi"),
            bound_pod_json("sb-2", "n1", "1", "1Gi"),
        ]],
        node_watch: vec![json!({"type": "MODIFIED", "object": grown})],
        ..Script::default()
    }));
    let b = KubeBackend::start(client(&script), cfg()).await.unwrap();
    let amount = |millicpus, memory_bytes| crate::backend::Amount {
        millicpus,
        memory_bytes,
    };
    // The MODIFIED event may land after the start: wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let report = loop {
        let r = b.nodes().unwrap();
        if r.nodes.iter().any(|n| n.allocatable.millicpus == 6000) {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the node watch's change never came: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(report.incomplete, None);
    let [n1, n2] = &report.nodes[..] else {
        panic!("{report:?}")
    };
    assert_eq!(n1.name, "n1");
    assert_eq!(n1.capacity, amount(4000, 8 << 30));
    assert_eq!(n1.allocatable, amount(1900, 8 << 30));
    assert_eq!(n1.requested, amount(1250, (256 << 20) + (1 << 30)));
    assert_eq!(n2.capacity, amount(8000, 8 << 30));
    assert_eq!(n2.allocatable, amount(6000, 4 << 30));
    assert_eq!(n2.requested, amount(0, 0));
    // The create check follows the watch too.
    assert_eq!(b.capacity().unwrap().cpus, 6.0);
    let before = script.lock().unwrap().calls.len();
    for _ in 0..3 {
        b.nodes().unwrap();
        b.capacity().unwrap();
    }
    assert_eq!(
        script.lock().unwrap().calls.len(),
        before,
        "no API call per answer"
    );
}

/// Without RBAC for nodes the backend starts at once and works on: creates are not
/// checked against the nodes, and `nodes` says why it lacks their capacity while still
/// giving the pods' nodes and requests.
#[tokio::test]
async fn a_forbidden_node_watch_leaves_the_backend_working_and_says_why() {
    let script = Arc::new(Mutex::new(Script {
        nodes_forbidden: true,
        lists: vec![vec![bound_pod_json("sb-late", "n1", "500m", "512Mi")]],
        ..Script::default()
    }));
    let started = Instant::now();
    let b = KubeBackend::start(client(&script), cfg()).await.unwrap();
    assert!(
        started.elapsed() < NODES_LIMIT,
        "no wait for nodes that cannot be read"
    );
    assert_eq!(b.capacity(), None);
    let r = b.nodes().unwrap();
    let why = r.incomplete.as_deref().unwrap();
    assert!(
        why.contains("forbidden") && why.contains("deploy/base/rbac.yaml"),
        "{why}"
    );
    assert_eq!(r.nodes.len(), 1);
    assert_eq!(
        (r.nodes[0].name.as_str(), r.nodes[0].requested.millicpus),
        ("n1", 500)
    );
    assert_eq!(r.nodes[0].allocatable, crate::backend::Amount::default());
    let list = Backend::list(&b).await.unwrap();
    assert_eq!(list.len(), 1, "the pods are still listed");
}

/// The scheduler finds no node for a create's pod, then the pod is scheduled (a node
/// joined) and runs: the create waits throughout instead of failing, and its progress
/// says unschedulable, with the scheduler's reason, only while it is.
#[tokio::test]
async fn an_unschedulable_pod_is_waited_for_and_reported_until_a_node_takes_it() {
    let (events, live) = tokio::sync::mpsc::unbounded_channel();
    let script = Arc::new(Mutex::new(Script {
        live: Some(live),
        ..Script::default()
    }));
    let b = KubeBackend::start(client(&script), cfg()).await.unwrap();
    let why = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are \
               available: 1 No preemption victims found for incoming pod.";
    let with_status = |rv: &str, status: Value| {
        let mut p = pod_json("sb-1", rv);
        p["status"] = status;
        p
    };
    let unschedulable = with_status(
        "21",
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
               "reason": "Unschedulable", "message": why}]}),
    );
    let starting = with_status(
        "22",
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
               "containerStatuses": [{"name": objects::SANDBOX_CONTAINER, "image": "busybox",
                                      "imageID": "", "ready": false, "restartCount": 0,
                                      "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
    );
    let (progress, mut waiting) = StartProgress::channel();
    let running = b.wait_running("sb-1", Some("uid-sb-1".into()), &progress);
    tokio::pin!(running);
    let next = |event: &str, pod: &Value| {
        events.send(json!({"type": event, "object": pod})).unwrap();
    };

    next("ADDED", &unschedulable);
    tokio::select! {
        r = &mut running => panic!("the wait ended while unschedulable: {r:?}"),
        r = waiting.changed() => r.unwrap(),
    }
    assert_eq!(waiting.borrow_and_update().as_deref(), Some(why));
    // Another look at the same condition (the scheduler retried) says nothing new.
    next(
        "MODIFIED",
        &with_status("21", unschedulable["status"].clone()),
    );
    next("MODIFIED", &starting);
    tokio::select! {
        r = &mut running => panic!("the wait ended before the pod ran: {r:?}"),
        r = waiting.changed() => r.unwrap(),
    }
    assert_eq!(
        *waiting.borrow_and_update(),
        None,
        "scheduled: no longer unschedulable"
    );

    next("MODIFIED", &pod_json("sb-1", "23"));
    let ip = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the running pod ends the wait")
        .unwrap();
    assert_eq!(ip.to_string(), "10.0.0.9");
    assert!(!waiting.has_changed().unwrap_or(false));
}

//! Warm pools on the real cluster: pods started ahead, a create that claims one (a
//! labelled, re-tokened warm pod rather than a new pod), the pool refilling itself,
//! unclaimed pods invisible as sandboxes, and shutdown removing them all.

use std::time::{Duration, Instant};

use orchard::backend::kubernetes::KubeBackend;
use orchard::backend::Backend;

use super::{kube_config, require_cluster, run, spec, TestNamespace};
use orchard_protocol::Command;

const BUSYBOX: &str = "docker.io/library/busybox:latest";

/// Names of the running, unclaimed warm pods whose agent passed its readiness probe
/// (the ones a create can claim).
pub(super) fn warm(ns: &TestNamespace) -> Vec<String> {
    ns.kubectl(&[
        "get",
        "pods",
        "-l",
        "orchard.dev/pool",
        "--field-selector",
        "status.phase=Running",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[?(@.name==\"sandbox\")].ready} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    ])
    .lines()
    // Pods being deleted are going, not warm.
    .filter_map(|l| l.strip_suffix(" true "))
    .map(str::to_string)
    .collect()
}

/// Waits (the keeper works on its own schedule) until `n` warm pods run.
async fn until_warm(ns: &TestNamespace, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let w = warm(ns);
        if w.len() == n {
            return w;
        }
        assert!(
            Instant::now() < deadline,
            "{} warm pods, not {n}: {w:?}",
            w.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_claims_a_warm_pod_and_the_pool_refills() {
    let kc = require_cluster!();
    let ns = TestNamespace::new(&kc, "pool");
    let mut cfg = kube_config(&kc, &ns);
    cfg.warm_pools = vec![(BUSYBOX.into(), 2)];
    cfg.warm_cpus = Some(0.1);
    cfg.warm_memory_bytes = Some(64 << 20);
    let b = KubeBackend::connect(cfg).await.unwrap();
    let first = until_warm(&ns, 2).await;
    assert!(
        Backend::list(&b).await.unwrap().is_empty(),
        "warm pods are not sandboxes"
    );

    let mut s = spec("claimed", BUSYBOX);
    s.env.clear();
    s.cpus = Some(0.1);
    s.memory_bytes = Some(64 << 20);
    let started = Instant::now();
    let sb = Backend::create(&b, s).await.unwrap();
    let claim_ms = started.elapsed().as_millis();
    let pod = ns.kubectl(&[
        "get",
        "pods",
        "-l",
        "orchard.dev/sandbox=claimed",
        "-o",
        "name",
    ]);
    let pod = pod.trim().trim_start_matches("pod/").to_string();
    assert!(
        first.contains(&pod),
        "{pod} is one of the warm pods {first:?} ({claim_ms} ms)"
    );
    let (code, out, _) = run(&sb, Command::Shell("echo claimed".into())).await;
    assert_eq!((code, out.as_str()), (Some(0), "claimed\n"));
    let listed = Backend::list(&b).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id.as_str(), listed[0].token.as_str()),
        ("claimed", sb.token.as_str())
    );

    // The pool tops itself up to two unclaimed pods, not counting the claimed one.
    let refilled = until_warm(&ns, 2).await;
    assert!(!refilled.contains(&pod));

    // A create the pool cannot serve (extra environment) starts a pod of its own.
    let cold = Backend::create(&b, spec("cold", BUSYBOX)).await.unwrap();
    let (_, out, _) = run(&cold, Command::Shell("echo $GREETING".into())).await;
    assert_eq!(out, "hello from k8s\n");
    ns.kubectl(&["get", "pod", "cold"]);

    Backend::delete(&b, "claimed").await.unwrap();
    let gone = ns.kubectl(&[
        "get",
        "pods,secrets",
        "-l",
        "orchard.dev/sandbox=claimed",
        "-o",
        "name",
    ]);
    assert_eq!(gone, "", "the claimed pod and its Secret are gone");
    Backend::shutdown(&b).await.unwrap();
    let left = ns.kubectl(&["get", "pods", "-o", "name"]);
    assert_eq!(left, "", "shutdown removes warm pods too");
}

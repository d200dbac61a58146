//! Prometheus metrics, kept and encoded by `prometheus-client`. Sandboxes by state, and
//! a cluster's nodes' CPU and memory, are gauges set at scrape time from what the caller
//! of [`Metrics::render`] read (the service's counts, the backend's node watch).
//!
//! The exposition is the Prometheus text format (`text/plain; version=0.0.4`, as the
//! API has always served and its OpenAPI document says): `prometheus-client` writes
//! OpenMetrics, which differs from it in two lines, fixed up in [`classic`]: a counter
//! family is named without its `_total` (the samples have it either way), and the text
//! ends with `# EOF`.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::backend::NodeCapacity;

/// Upper bounds (seconds) of the latency buckets: 100 µs to 2 min.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
    30.0, 120.0,
];

fn latency() -> Histogram {
    Histogram::new(BUCKETS)
}

/// `code` of the request and error counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Code {
    code: String,
}

/// `route` of the exec histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Route {
    route: &'static str,
}

/// `state` of the sandboxes gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

/// `node` of the node gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeName {
    node: String,
}

/// A gauge of whole numbers.
pub type IntGauge = Gauge<u64, AtomicU64>;

/// A gauge of fractions (CPU cores).
type FloatGauge = Gauge<f64, AtomicU64>;

/// A cluster's nodes: capacity, allocatable and requested CPU (cores) and memory
/// (bytes), one series per node and figure. Six series a node: a cluster of 5,000 nodes
/// makes 30,000, which is why they are per node only (no per-pod series) and why no
/// totals are kept (`sum()` of a family is one).
#[derive(Default)]
struct NodeGauges {
    cpu: [Family<NodeName, FloatGauge>; 3],
    memory: [Family<NodeName, IntGauge>; 3],
}

impl NodeGauges {
    /// The three figures, in the order of the families.
    const FIGURES: [&'static str; 3] = ["capacity", "allocatable", "requested"];

    fn register(&self, r: &mut Registry) {
        let help = [
            "the node's whole size",
            "what pods may have of the node",
            "what this server's sandbox pods on the node request",
        ];
        for (i, figure) in Self::FIGURES.iter().enumerate() {
            r.register(
                format!("orchard_node_cpu_{figure}_cores"),
                format!("CPU cores of a node: {}", help[i]),
                self.cpu[i].clone(),
            );
            r.register(
                format!("orchard_node_memory_{figure}_bytes"),
                format!("Memory bytes of a node: {}", help[i]),
                self.memory[i].clone(),
            );
        }
    }

    /// Sets every node's series; nodes gone since the last scrape are dropped.
    fn set(&self, nodes: &[NodeCapacity]) {
        for f in &self.cpu {
            f.clear();
        }
        for f in &self.memory {
            f.clear();
        }
        for n in nodes {
            let label = NodeName {
                node: n.name.clone(),
            };
            for (i, a) in [n.capacity, n.allocatable, n.requested].iter().enumerate() {
                self.cpu[i].get_or_create(&label).set(a.cores());
                self.memory[i].get_or_create(&label).set(a.memory_bytes);
            }
        }
    }
}

/// The orchestrator's metrics.
pub struct Metrics {
    /// Time from create request to ready.
    pub create_seconds: Histogram,
    /// Exec through the compatible jobs route.
    pub exec_compat_seconds: Histogram,
    /// Exec through `/v1/sandboxes/{id}/exec`.
    pub exec_v1_seconds: Histogram,
    requests: Family<Code, Counter>,
    errors: Family<Code, Counter>,
    sandboxes: Family<State, IntGauge>,
    nodes: NodeGauges,
    /// The image store's GC: see [`ImageGcMetrics`].
    pub image_gc: ImageGcMetrics,
    /// Every family, in the order of the exposition. The lock also keeps two scrapes
    /// from interleaving their settings of the sandboxes gauge.
    registry: Mutex<Registry>,
}

/// The image store's size and what its GC removed.
#[derive(Default)]
pub struct ImageGcMetrics {
    /// Allocated bytes of layers and blobs, as of the last pass.
    pub store_bytes: IntGauge,
    /// Bytes the GC freed.
    pub bytes_total: Counter,
    /// Images the GC forgot to meet the budget.
    pub images_total: Counter,
    /// Layers the GC removed.
    pub layers_total: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let exec = Family::<Route, Histogram>::new_with_constructor(latency as fn() -> _);
        let mut m = Metrics {
            create_seconds: latency(),
            exec_compat_seconds: exec.get_or_create_owned(&Route { route: "compat" }),
            exec_v1_seconds: exec.get_or_create_owned(&Route { route: "v1" }),
            requests: Family::default(),
            errors: Family::default(),
            sandboxes: Family::default(),
            nodes: NodeGauges::default(),
            image_gc: ImageGcMetrics::default(),
            registry: Mutex::default(),
        };
        let r = m.registry.get_mut().unwrap_or_else(|p| p.into_inner());
        let gc = &m.image_gc;
        // Registered in the order of the exposition; the HELP texts get their final
        // period from the encoder, and counters their `_total`.
        r.register(
            "orchard_sandboxes",
            "Sandboxes by state",
            m.sandboxes.clone(),
        );
        r.register(
            "orchard_sandbox_create_seconds",
            "Time from a create request to a ready sandbox",
            m.create_seconds.clone(),
        );
        r.register(
            "orchard_exec_seconds",
            "Time of an exec request, by route",
            exec,
        );
        r.register(
            "orchard_http_requests",
            "Requests answered, by status",
            m.requests.clone(),
        );
        r.register(
            "orchard_errors",
            "Error answers, by error code",
            m.errors.clone(),
        );
        r.register(
            "orchard_image_store_bytes",
            "Allocated bytes of the image store's layers and blobs, as of the last GC pass",
            gc.store_bytes.clone(),
        );
        r.register(
            "orchard_image_gc_bytes",
            "Bytes the image GC freed",
            gc.bytes_total.clone(),
        );
        r.register(
            "orchard_image_gc_images",
            "Images the image GC removed to meet the disk budget",
            gc.images_total.clone(),
        );
        r.register(
            "orchard_image_gc_layers",
            "Unpacked layers the image GC removed",
            gc.layers_total.clone(),
        );
        m.nodes.register(r);
        m
    }
}

impl Metrics {
    /// Counts one answered request by status.
    pub fn request(&self, status: u16) {
        let code = Code {
            code: status.to_string(),
        };
        self.requests.get_or_create(&code).inc();
    }

    /// Counts one error answer by code.
    pub fn error(&self, code: &'static str) {
        let code = Code { code: code.into() };
        self.errors.get_or_create(&code).inc();
    }

    /// The text exposition, with `sandboxes` as the by-state gauge and `nodes` (a
    /// cluster backend's; none on one host) as the node gauges.
    pub fn render(
        &self,
        sandboxes: &BTreeMap<&'static str, u64>,
        nodes: &[NodeCapacity],
    ) -> String {
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // States no sandbox is in any more are left out, as they were before.
        self.sandboxes.clear();
        for (state, n) in sandboxes {
            self.sandboxes.get_or_create(&State { state }).set(*n);
        }
        self.nodes.set(nodes);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        classic(&text)
    }
}

/// The Prometheus text format of `openmetrics` (see the module header): `# HELP` and
/// `# TYPE` of a counter name its samples (`_total`), and no `# EOF`.
fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len() + 256);
    let mut counters = Vec::new();
    for line in openmetrics.lines() {
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|t| t.strip_suffix(" counter"))
        {
            counters.push(name);
        }
    }
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let family = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let name = rest.split(' ').next()?;
            counters
                .contains(&name)
                .then(|| (*p, name, &rest[name.len()..]))
        });
        match family {
            Some((p, name, rest)) => out.push_str(&format!("{p}{name}_total{rest}")),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.create_seconds.observe(0.0002);
        m.create_seconds.observe(0.003);
        m.create_seconds.observe(500.0);
        m.error("not_found");
        let text = m.render(&BTreeMap::from([("running", 2)]), &[]);
        assert!(
            text.contains("orchard_sandbox_create_seconds_bucket{le=\"0.00025\"} 1"),
            "{text}"
        );
        assert!(text.contains("orchard_sandbox_create_seconds_bucket{le=\"0.005\"} 2"));
        assert!(text.contains("orchard_sandbox_create_seconds_bucket{le=\"+Inf\"} 3"));
        assert!(text.contains("orchard_sandbox_create_seconds_count 3"));
        assert!(text.contains("orchard_sandboxes{state=\"running\"} 2"));
        assert!(text.contains("orchard_errors_total{code=\"not_found\"} 1"));
    }

    #[test]
    fn the_exposition_keeps_every_family_and_its_samples_names() {
        let m = Metrics::default();
        m.request(200);
        // A labelled family with no sample yet has no lines at all.
        m.error("not_found");
        m.image_gc.bytes_total.inc_by(7);
        m.image_gc.store_bytes.set(9);
        m.exec_v1_seconds.observe(0.001);
        let text = m.render(&BTreeMap::from([("pending", 1)]), &[]);
        for line in [
            "# TYPE orchard_sandboxes gauge",
            "# TYPE orchard_sandbox_create_seconds histogram",
            "# TYPE orchard_exec_seconds histogram",
            "# TYPE orchard_http_requests_total counter",
            "# HELP orchard_http_requests_total Requests answered, by status.",
            "# TYPE orchard_errors_total counter",
            "# TYPE orchard_image_store_bytes gauge",
            "# TYPE orchard_image_gc_bytes_total counter",
            "# TYPE orchard_image_gc_images_total counter",
            "# TYPE orchard_image_gc_layers_total counter",
            "orchard_http_requests_total{code=\"200\"} 1",
            "orchard_image_gc_bytes_total 7",
            "orchard_image_store_bytes 9",
            "orchard_exec_seconds_count{route=\"v1\"} 1",
            "orchard_exec_seconds_count{route=\"compat\"} 0",
            "orchard_sandboxes{state=\"pending\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
        // A state with no sandbox left is not reported.
        let text = m.render(&BTreeMap::new(), &[]);
        assert!(!text.contains("state=\"pending\""), "{text}");
    }

    /// A cluster's nodes are one series per node and figure, set at each scrape: a node
    /// gone since the last one is no longer reported.
    #[test]
    fn node_gauges_follow_the_nodes_of_each_scrape() {
        use crate::backend::Amount;
        let m = Metrics::default();
        let node = |name: &str, millicpus| NodeCapacity {
            name: name.into(),
            capacity: Amount {
                millicpus: 8000,
                memory_bytes: 16 << 30,
            },
            allocatable: Amount {
                millicpus: 7800,
                memory_bytes: 15 << 30,
            },
            requested: Amount {
                millicpus,
                memory_bytes: 256 << 20,
            },
        };
        let text = m.render(&BTreeMap::new(), &[node("n1", 250), node("n2", 0)]);
        for line in [
            "# TYPE orchard_node_cpu_capacity_cores gauge",
            "# TYPE orchard_node_memory_requested_bytes gauge",
            "orchard_node_cpu_capacity_cores{node=\"n1\"} 8.0",
            "orchard_node_cpu_allocatable_cores{node=\"n1\"} 7.8",
            "orchard_node_cpu_requested_cores{node=\"n1\"} 0.25",
            "orchard_node_cpu_requested_cores{node=\"n2\"} 0.0",
            "orchard_node_memory_capacity_bytes{node=\"n1\"} 17179869184",
            "orchard_node_memory_allocatable_bytes{node=\"n2\"} 16106127360",
            "orchard_node_memory_requested_bytes{node=\"n2\"} 268435456",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        let text = m.render(&BTreeMap::new(), &[node("n2", 0)]);
        assert!(!text.contains("node=\"n1\""), "{text}");
        assert!(text.contains("node=\"n2\""), "{text}");
        // One host (no cluster): no node series at all.
        let text = m.render(&BTreeMap::new(), &[]);
        assert!(!text.contains("node=\""), "{text}");
    }
}

//! Prometheus metrics, rendered by hand in the text exposition format: a few counters
//! and histograms need no client library. Sandboxes by state are a gauge computed at
//! scrape time by the caller of [`Metrics::render`].

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency buckets: 100 µs to 2 min.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
    30.0, 120.0,
];

/// One histogram.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds (atomics hold integers).
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|b| seconds <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in BUCKETS.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// The orchestrator's metrics.
#[derive(Default)]
pub struct Metrics {
    /// Time from create request to ready.
    pub create_seconds: Histogram,
    /// Exec through the compatible jobs route.
    pub exec_compat_seconds: Histogram,
    /// Exec through `/v1/sandboxes/{id}/exec`.
    pub exec_v1_seconds: Histogram,
    requests: Mutex<BTreeMap<u16, u64>>,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    /// The image store's GC: see [`ImageGcMetrics`].
    pub image_gc: ImageGcMetrics,
}

/// The image store's size and what its GC removed.
#[derive(Default)]
pub struct ImageGcMetrics {
    /// Allocated bytes of layers and blobs, as of the last pass.
    pub store_bytes: AtomicU64,
    /// Bytes the GC freed.
    pub bytes_total: AtomicU64,
    /// Images the GC forgot to meet the budget.
    pub images_total: AtomicU64,
    /// Layers the GC removed.
    pub layers_total: AtomicU64,
}

impl ImageGcMetrics {
    fn render(&self, out: &mut String) {
        for (name, kind, help, value) in [
            (
                "orchard_image_store_bytes",
                "gauge",
                "Allocated bytes of the image store's layers and blobs, as of the last GC pass.",
                &self.store_bytes,
            ),
            (
                "orchard_image_gc_bytes_total",
                "counter",
                "Bytes the image GC freed.",
                &self.bytes_total,
            ),
            (
                "orchard_image_gc_images_total",
                "counter",
                "Images the image GC removed to meet the disk budget.",
                &self.images_total,
            ),
            (
                "orchard_image_gc_layers_total",
                "counter",
                "Unpacked layers the image GC removed.",
                &self.layers_total,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                value.load(Ordering::Relaxed)
            );
        }
    }
}

impl Metrics {
    /// Counts one answered request by status.
    pub fn request(&self, status: u16) {
        *self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(status)
            .or_default() += 1;
    }

    /// Counts one error answer by code.
    pub fn error(&self, code: &'static str) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(code)
            .or_default() += 1;
    }

    /// The text exposition, with `sandboxes` as the by-state gauge.
    pub fn render(&self, sandboxes: &BTreeMap<&'static str, u64>) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP orchard_sandboxes Sandboxes by state.\n# TYPE orchard_sandboxes gauge\n",
        );
        for (state, n) in sandboxes {
            let _ = writeln!(out, "orchard_sandboxes{{state=\"{state}\"}} {n}");
        }
        out.push_str("# HELP orchard_sandbox_create_seconds Time from a create request to a ready sandbox.\n# TYPE orchard_sandbox_create_seconds histogram\n");
        self.create_seconds
            .render(&mut out, "orchard_sandbox_create_seconds", "");
        out.push_str("# HELP orchard_exec_seconds Time of an exec request, by route.\n# TYPE orchard_exec_seconds histogram\n");
        self.exec_compat_seconds
            .render(&mut out, "orchard_exec_seconds", "route=\"compat\"");
        self.exec_v1_seconds
            .render(&mut out, "orchard_exec_seconds", "route=\"v1\"");
        out.push_str("# HELP orchard_http_requests_total Requests answered, by status.\n# TYPE orchard_http_requests_total counter\n");
        for (code, n) in self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(out, "orchard_http_requests_total{{code=\"{code}\"}} {n}");
        }
        out.push_str("# HELP orchard_errors_total Error answers, by error code.\n# TYPE orchard_errors_total counter\n");
        for (code, n) in self.errors.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "orchard_errors_total{{code=\"{code}\"}} {n}");
        }
        self.image_gc.render(&mut out);
        out
    }
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
        let text = m.render(&BTreeMap::from([("running", 2)]));
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
}

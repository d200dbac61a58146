//! What the benchmarks share: percentiles of a series, where a results table is
//! written, and the comparison with the table of the previous run.

use std::path::PathBuf;

/// Median, 90th and 99th percentile of a series.
#[derive(Clone, Copy, Default)]
pub struct Pcts {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// The percentiles of `samples` (all zero for none).
pub fn pcts(samples: &[f64]) -> Pcts {
    if samples.is_empty() {
        return Pcts::default();
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| s[((q * (s.len() - 1) as f64).round() as usize).min(s.len() - 1)];
    Pcts {
        n: s.len(),
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
    }
}

impl Pcts {
    /// `n | p50 | p90` table cells, p90 as `–` under 10 samples.
    pub fn cells(&self, decimals: usize) -> String {
        let p90 = if self.n >= 10 {
            format!("{:.decimals$}", self.p90)
        } else {
            "–".into()
        };
        format!("{} | {:.decimals$} | {p90}", self.n, self.p50)
    }
}

/// Where a results table goes: `ORCHARD_BENCH_OUT`, else `bench/results/<file>`.
pub fn out_path(file: &str) -> PathBuf {
    std::env::var_os("ORCHARD_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/results")).join(file)
        })
}

/// `now` against the previous run's value, as a signed percentage (`–` without one).
pub fn change(now: f64, prev: Option<f64>) -> String {
    match prev {
        Some(p) if p > 0.0 => format!("{:+.1}%", 100.0 * (now - p) / p),
        _ => "–".into(),
    }
}

/// The number in column `column` (1 = the label) of the row `label` of a previous
/// Markdown table, if any.
pub fn previous(prev: &str, label: &str, column: usize) -> Option<f64> {
    prev.lines()
        .find(|l| l.starts_with(&format!("| {label} |")))
        .and_then(|l| l.split('|').nth(column))
        .and_then(|c| c.trim().parse().ok())
}

#[test]
fn a_previous_table_is_read_by_column() {
    let table = "| x | 1 | 2 |\n| exec, one replica | 300 | 2015.5 | 4677 |";
    assert_eq!(previous(table, "exec, one replica", 2), Some(300.0));
    assert_eq!(previous(table, "exec, one replica", 3), Some(2015.5));
    assert_eq!(previous(table, "exec", 3), None);
    assert_eq!(change(110.0, Some(100.0)), "+10.0%");
    assert_eq!(pcts(&[3.0, 1.0, 2.0]).p50, 2.0);
}

/// POSTs the JSON `body` to `url` with the test key; answers the JSON answer, or what
/// went wrong (a status that is not a success included).
pub async fn post_json(
    http: &reqwest::Client,
    url: &str,
    body: &'static [u8],
) -> Result<serde_json::Value, String> {
    let resp = http
        .post(url)
        .header("X-API-Key", super::server::KEY)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&bytes)));
    }
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

//! Percentiles and summaries of latency samples, shared by the benchmark binaries.

/// Percentile `q` (0..=1) of sorted `xs` by the nearest-rank method; 0 when empty.
pub fn pct_sorted(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}

/// p50, p90, p99 and the maximum of a series.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pcts {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl Pcts {
    /// Summarises `xs` (any order).
    pub fn of(xs: &[f64]) -> Pcts {
        let mut s = xs.to_vec();
        s.sort_by(f64::total_cmp);
        Pcts {
            n: s.len(),
            p50: pct_sorted(&s, 0.5),
            p90: pct_sorted(&s, 0.9),
            p99: pct_sorted(&s, 0.99),
            max: s.last().copied().unwrap_or(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Pcts::of(&xs);
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(Pcts::of(&[]).p50, 0.0);
    }
}

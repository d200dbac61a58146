//! Latency over time as a PNG: per time bucket, the p50 and p99 of each operation
//! (log scale) above the calls completed per second.
//!
//! Text needs a TrueType font, read at run time (`ORCHARD_PLOT_FONT`, else the usual
//! DejaVu or Liberation paths; Debian's `fonts-dejavu-core`), so the binary links no
//! font library.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;

use crate::load::{LoadReport, Op};
use crate::stats::pct_sorted;

/// Fonts tried in turn when `ORCHARD_PLOT_FONT` is not set.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Why there is no plot.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No font to draw text with.
    #[error("no TrueType font found (install fonts-dejavu-core or set ORCHARD_PLOT_FONT)")]
    NoFont,
    /// Nothing to plot.
    #[error("no successful calls to plot")]
    Empty,
    /// The drawing failed.
    #[error("drawing {path}: {message}")]
    Draw {
        /// The PNG.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

fn register_font() -> Result<(), PlotError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        let from_env = std::env::var("ORCHARD_PLOT_FONT").ok();
        let candidates = from_env
            .iter()
            .map(String::as_str)
            .chain(FONTS.iter().copied());
        for path in candidates {
            if let Ok(bytes) = std::fs::read(path) {
                // Registered fonts live as long as the process: leak the one file.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::NoFont)
    }
}

/// One line: (bucket start in seconds, value).
type Series = Vec<(f64, f64)>;

/// Per bucket of `width` seconds: p50 and p99 (ms) per operation, and calls per second.
fn buckets(report: &LoadReport, width: f64) -> (BTreeMap<Op, (Series, Series)>, Series) {
    let n = (report.secs / width).ceil().max(1.0) as usize;
    let mut per_op: BTreeMap<Op, Vec<Vec<f64>>> = BTreeMap::new();
    let mut counts = vec![0u64; n];
    for s in report.samples.iter().filter(|s| s.ok) {
        let b = ((s.at_s / width) as usize).min(n - 1);
        per_op.entry(s.op).or_insert_with(|| vec![Vec::new(); n])[b].push(s.us / 1000.0);
        counts[b] += 1;
    }
    let mut lines = BTreeMap::new();
    for (op, mut bs) in per_op {
        let (mut p50, mut p99) = (Vec::new(), Vec::new());
        for (i, b) in bs.iter_mut().enumerate() {
            if b.is_empty() {
                continue;
            }
            b.sort_by(f64::total_cmp);
            let x = (i as f64 + 0.5) * width;
            p50.push((x, pct_sorted(b, 0.5)));
            p99.push((x, pct_sorted(b, 0.99)));
        }
        lines.insert(op, (p50, p99));
    }
    let rate = counts
        .iter()
        .enumerate()
        .map(|(i, &c)| ((i as f64 + 0.5) * width, c as f64 / width))
        .collect();
    (lines, rate)
}

fn colour(op: Op) -> RGBColor {
    match op {
        Op::Exec => RGBColor(31, 119, 180),
        Op::V1Exec => RGBColor(255, 127, 14),
        Op::FilePut => RGBColor(44, 160, 44),
        Op::FileGet => RGBColor(214, 39, 40),
        Op::Session => RGBColor(148, 103, 189),
    }
}

/// Draws `report` into the PNG at `path` under `title`.
pub fn latency_png(path: &Path, title: &str, report: &LoadReport) -> Result<(), PlotError> {
    register_font()?;
    if report.samples.iter().all(|s| !s.ok) {
        return Err(PlotError::Empty);
    }
    let draw_err = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let width = if report.secs >= 20.0 {
        1.0
    } else {
        (report.secs / 20.0).max(0.05)
    };
    let (lines, rate) = buckets(report, width);
    let x_max = report.secs.max(width);
    let y_min = lines
        .values()
        .flat_map(|(a, _)| a.iter().map(|p| p.1))
        .fold(f64::INFINITY, f64::min)
        .max(0.01)
        * 0.7;
    let y_max = lines
        .values()
        .flat_map(|(_, b)| b.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(y_min * 2.0)
        * 1.4;
    let r_max = rate.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;

    let root = BitMapBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(&e))?;
    let root = root
        .titled(title, ("sans-serif", 22))
        .map_err(|e| draw_err(&e))?;
    let (top, bottom) = root.split_vertically(540);

    let mut chart = ChartBuilder::on(&top)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, (y_min..y_max).log_scale())
        .map_err(|e| draw_err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds into the run")
        .y_desc("latency, ms (log): solid p50, dashed p99")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(&e))?;
    for (op, (p50, p99)) in &lines {
        let c = colour(*op);
        chart
            .draw_series(LineSeries::new(p50.iter().copied(), c.stroke_width(2)))
            .map_err(|e| draw_err(&e))?
            .label(format!("{} p50", op.key()))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(
                p99.iter().copied(),
                6,
                4,
                c.stroke_width(1),
            ))
            .map_err(|e| draw_err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(&e))?;

    let mut chart = ChartBuilder::on(&bottom)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..r_max)
        .map_err(|e| draw_err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds into the run")
        .y_desc("calls/s (all)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(&e))?;
    chart
        .draw_series(LineSeries::new(rate, BLACK.stroke_width(2)))
        .map_err(|e| draw_err(&e))?;
    root.present().map_err(|e| draw_err(&e))?;
    Ok(())
}

//! Progress on stderr: a bar redrawn in place when stderr is a terminal, a few plain
//! lines (milestones) when it is not, so logs of scripted runs stay readable.
//!
//! The formatting ([`human_bytes`], [`bar`], [`PullState::line`], [`upload_line`]) is pure
//! and unit-tested; [`Meter`] only decides when and how to write it.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use super::term;

/// Least time between two redraws: enough for the eye, little enough not to spend the
/// CPU on the terminal when progress reports come by the thousand.
const REDRAW: Duration = Duration::from_millis(80);

/// `1536` -> `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A bar of `width` cells (brackets included) filled to `done / total`.
pub fn bar(done: u64, total: u64, width: usize) -> String {
    let inner = width.saturating_sub(2);
    let filled = if total == 0 {
        0
    } else {
        ((done.min(total) as f64 / total as f64) * inner as f64).floor() as usize
    };
    let mut s = String::with_capacity(width);
    s.push('[');
    for i in 0..inner {
        s.push(if i < filled {
            '='
        } else if i == filled && filled > 0 {
            '>'
        } else {
            ' '
        });
    }
    s.push(']');
    s
}

/// `done / total` in whole percent, at most 100 (totals may be estimates).
pub fn percent(done: u64, total: u64) -> u64 {
    if total == 0 {
        return 0;
    }
    ((done.min(total) as f64 / total as f64) * 100.0).floor() as u64
}

/// `label [bar] pct% stats` fitted to `width` columns: the bar takes what the words leave,
/// and is dropped when less than 10 columns remain.
fn fit(label: &str, done: u64, total: u64, stats: &str, width: usize) -> String {
    let words = if total > 0 {
        format!("{:>3}%  {stats}", percent(done, total))
    } else {
        stats.to_string()
    };
    let fixed = label.chars().count() + 1 + 1 + words.chars().count();
    let room = width.saturating_sub(fixed + 1).min(40);
    if total > 0 && room >= 10 {
        format!("{label} {} {words}", bar(done, total, room))
    } else {
        format!("{label} {words}")
    }
}

/// Where a pull is, from the server's progress lines (one per layer report).
#[derive(Debug, Default, Clone)]
pub struct PullState {
    /// Bytes done and total of each layer seen so far.
    layers: BTreeMap<String, (u64, u64)>,
    /// Layers complete, as the server counts them (present layers count at once).
    pub layers_done: u64,
    /// Layers in the image.
    pub layers_total: u64,
    /// The last `layers_done` a plain line was printed for.
    noted: Option<u64>,
}

impl PullState {
    /// Takes one progress report.
    pub fn update(
        &mut self,
        layer: &str,
        bytes_done: u64,
        bytes_total: u64,
        layers_done: u64,
        layers_total: u64,
    ) {
        if !layer.is_empty() {
            self.layers
                .insert(layer.to_string(), (bytes_done, bytes_total));
        }
        self.layers_done = layers_done;
        self.layers_total = layers_total;
    }

    /// Bytes done and total over the layers seen so far.
    pub fn bytes(&self) -> (u64, u64) {
        self.layers
            .values()
            .fold((0, 0), |(d, t), (ld, lt)| (d + ld.min(lt), t + lt))
    }

    /// The bar line for a terminal of `width` columns.
    pub fn line(&self, reference: &str, width: usize) -> String {
        let (done, total) = self.bytes();
        let stats = format!(
            "{} / {}  layers {}/{}",
            human_bytes(done),
            human_bytes(total),
            self.layers_done,
            self.layers_total
        );
        fit(reference, done, total, &stats, width)
    }

    /// A plain line when a layer completed since the last one, for logs.
    pub fn milestone(&mut self, reference: &str) -> Option<String> {
        if self.noted == Some(self.layers_done) {
            return None;
        }
        self.noted = Some(self.layers_done);
        let (done, total) = self.bytes();
        Some(format!(
            "{reference}: {}/{} layers, {} of {}",
            self.layers_done,
            self.layers_total,
            human_bytes(done),
            human_bytes(total)
        ))
    }
}

/// The bar line of an upload.
pub fn upload_line(label: &str, done: u64, total: u64, width: usize) -> String {
    let stats = if done >= total {
        human_bytes(done)
    } else {
        format!("{} / {}", human_bytes(done), human_bytes(total))
    };
    fit(label, done, total, &stats, width)
}

/// A plain line for logs when an upload passed a quarter mark (`quarter` holds the
/// last one printed): 25, 50 and 75 %, then "importing" once it is all sent, but only
/// after an earlier mark, so small uploads print nothing.
pub fn upload_milestone(done: u64, total: u64, quarter: &mut u64) -> Option<String> {
    if total == 0 {
        return None;
    }
    let now = (done.saturating_mul(4) / total).min(4);
    if now <= *quarter {
        return None;
    }
    let first = *quarter == 0;
    *quarter = now;
    if now < 4 {
        Some(format!(
            "uploaded {}% ({} of {})",
            now * 25,
            human_bytes(done),
            human_bytes(total)
        ))
    } else if !first {
        Some(format!(
            "uploaded {}; the server is importing it",
            human_bytes(done)
        ))
    } else {
        None
    }
}

/// Writes progress to stderr.
pub struct Meter {
    tty: bool,
    last_draw: Option<Instant>,
    /// A bar is on screen (to be cleared before anything else is printed).
    drawn: bool,
}

impl Meter {
    /// A meter on this process's stderr.
    pub fn stderr() -> Self {
        Self {
            tty: term::is_tty(term::STDERR),
            last_draw: None,
            drawn: false,
        }
    }

    /// True when stderr is a terminal: draw bars; else print milestones.
    pub fn is_tty(&self) -> bool {
        self.tty
    }

    /// Columns of the terminal stderr is on (80 when unknown).
    pub fn width(&self) -> usize {
        term::window_size(term::STDERR).map_or(80, |(_, cols)| usize::from(cols))
    }

    /// Redraws the bar as `line` (terminal only); at most every [`REDRAW`] unless
    /// `force`.
    pub fn draw(&mut self, line: &str, force: bool) {
        if !self.tty {
            return;
        }
        let now = Instant::now();
        if !force && self.last_draw.is_some_and(|t| now - t < REDRAW) {
            return;
        }
        self.last_draw = Some(now);
        self.drawn = true;
        // Progress is decoration: a failing stderr must not fail the pull.
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
    }

    /// Prints `line` on a line of its own (in both modes), below any bar.
    pub fn note(&mut self, line: &str) {
        self.clear();
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }

    /// Erases the bar, if one is drawn.
    pub fn clear(&mut self) {
        if self.drawn {
            self.drawn = false;
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

impl Drop for Meter {
    /// An error path must not leave a half bar in front of the error message.
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_humanised() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(human_bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn bars_fill_with_the_fraction() {
        assert_eq!(bar(0, 100, 12), "[          ]");
        assert_eq!(bar(50, 100, 12), "[=====>    ]");
        assert_eq!(bar(100, 100, 12), "[==========]");
        assert_eq!(bar(200, 100, 12), "[==========]");
        assert_eq!(bar(5, 0, 4), "[  ]");
        assert_eq!(percent(1, 3), 33);
        assert_eq!(percent(9, 3), 100);
        assert_eq!(percent(1, 0), 0);
    }

    #[test]
    fn pull_lines_sum_the_layers_and_fit_the_width() {
        let mut s = PullState::default();
        s.update("sha256:a", 512 * 1024, 1024 * 1024, 0, 2);
        s.update("sha256:b", 0, 1024 * 1024, 0, 2);
        s.update("sha256:a", 1024 * 1024, 1024 * 1024, 1, 2);
        assert_eq!(s.bytes(), (1024 * 1024, 2 * 1024 * 1024));
        let line = s.line("busybox:latest", 100);
        assert!(line.starts_with("busybox:latest ["), "{line}");
        assert!(
            line.ends_with(" 50%  1.0 MiB / 2.0 MiB  layers 1/2"),
            "{line}"
        );
        assert!(line.chars().count() < 100, "{line}");
        // Too narrow for a bar: the words stay.
        let narrow = s.line("busybox:latest", 50);
        assert_eq!(narrow, "busybox:latest  50%  1.0 MiB / 2.0 MiB  layers 1/2");
    }

    #[test]
    fn pull_milestones_come_once_per_completed_layer() {
        let mut s = PullState::default();
        s.update("sha256:a", 10, 100, 0, 2);
        assert_eq!(
            s.milestone("x").as_deref(),
            Some("x: 0/2 layers, 10 B of 100 B")
        );
        s.update("sha256:a", 50, 100, 0, 2);
        assert_eq!(s.milestone("x"), None);
        s.update("sha256:a", 100, 100, 1, 2);
        assert!(s.milestone("x").is_some());
        assert_eq!(s.milestone("x"), None);
    }

    #[test]
    fn upload_milestones_are_quarters_and_small_uploads_are_quiet() {
        let mut q = 0;
        assert_eq!(upload_milestone(10, 100, &mut q), None);
        assert_eq!(
            upload_milestone(30, 100, &mut q).as_deref(),
            Some("uploaded 25% (30 B of 100 B)")
        );
        assert_eq!(upload_milestone(40, 100, &mut q), None);
        assert_eq!(
            upload_milestone(80, 100, &mut q).as_deref(),
            Some("uploaded 75% (80 B of 100 B)")
        );
        assert_eq!(
            upload_milestone(100, 100, &mut q).as_deref(),
            Some("uploaded 100 B; the server is importing it")
        );
        assert_eq!(upload_milestone(100, 100, &mut q), None);
        // All sent before the first look: nothing to say.
        let mut q = 0;
        assert_eq!(upload_milestone(9, 9, &mut q), None);
        assert_eq!(upload_milestone(9, 9, &mut q), None);
        assert_eq!(upload_milestone(1, 0, &mut q), None);
    }

    #[test]
    fn upload_lines_show_done_of_total() {
        let line = upload_line("uploading", 3 << 20, 12 << 20, 80);
        assert!(
            line.starts_with("uploading [") && line.ends_with(" 25%  3.0 MiB / 12.0 MiB"),
            "{line}"
        );
        // An estimate that came out short does not claim more than 100%.
        let line = upload_line("uploading", 13 << 20, 12 << 20, 80);
        assert!(line.ends_with("100%  13.0 MiB"), "{line}");
    }
}

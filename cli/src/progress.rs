//! Progress on stderr: an `indicatif` bar redrawn in place when stderr is a terminal
//! (indicatif hides it otherwise), a few plain lines (milestones) when it is not, so
//! logs of scripted runs stay readable.
//!
//! The words ([`human_bytes`], [`PullState::stats`], [`upload_stats`]) and the milestones
//! are pure and unit-tested; [`Meter`] holds the bar and decides which of the two shows.

use std::collections::BTreeMap;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bar: label, bar over the width the words leave, percent, the words.
const BAR: &str = "{prefix} [{wide_bar}] {percent:>3}%  {msg}";
/// No total known yet: a bar would claim 100 % of nothing, so words only.
const WORDS: &str = "{prefix} {msg}";

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

    /// The words beside the bar: bytes over the layers seen, and layers done.
    pub fn stats(&self) -> String {
        let (done, total) = self.bytes();
        format!(
            "{} / {}  layers {}/{}",
            human_bytes(done),
            human_bytes(total),
            self.layers_done,
            self.layers_total
        )
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

/// The words beside an upload's bar.
pub fn upload_stats(done: u64, total: u64) -> String {
    if done >= total {
        human_bytes(done)
    } else {
        format!("{} / {}", human_bytes(done), human_bytes(total))
    }
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

/// Progress on this process's stderr.
pub struct Meter {
    bar: ProgressBar,
    /// Shown in front of the bar; set on each draw, so nothing shows before the first.
    label: String,
    /// Whether the bar has a total (the [`BAR`] style) or not yet ([`WORDS`]).
    bounded: bool,
}

impl Meter {
    /// A meter labelled `label` on this process's stderr. Nothing is drawn until
    /// [`Meter::draw`]: an upload that is over before its first tick shows no bar.
    pub fn stderr(label: &str) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(style(WORDS));
        Meter {
            bar,
            label: label.to_string(),
            bounded: false,
        }
    }

    /// True when stderr is a terminal: draw the bar; else print milestones.
    pub fn is_tty(&self) -> bool {
        !self.bar.is_hidden()
    }

    /// Shows `done` of `total` with `stats` beside it (terminal only; indicatif limits
    /// how often it actually redraws).
    pub fn draw(&mut self, done: u64, total: u64, stats: String) {
        if self.bounded != (total > 0) {
            self.bounded = total > 0;
            self.bar
                .set_style(style(if self.bounded { BAR } else { WORDS }));
        }
        self.bar.set_prefix(self.label.clone());
        self.bar.set_length(total);
        // A total that was an estimate must not show more than 100 %.
        self.bar.set_position(done.min(total));
        self.bar.set_message(stats);
    }

    /// Relabels the bar from its next draw.
    pub fn relabel(&mut self, label: &str) {
        self.label = label.to_string();
    }

    /// Prints `line` on a line of its own (in both modes), above any bar.
    pub fn note(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }

    /// Erases the bar, if one is drawn.
    pub fn clear(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Meter {
    /// An error path must not leave a half bar in front of the error message.
    fn drop(&mut self) {
        self.clear();
    }
}

/// The style of `template`; the default bar should a template ever not parse (they are
/// constants, checked by a test).
fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
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
    fn templates_parse() {
        for template in [BAR, WORDS] {
            assert!(ProgressStyle::with_template(template).is_ok(), "{template}");
        }
    }

    #[test]
    fn pull_stats_sum_the_layers() {
        let mut s = PullState::default();
        s.update("sha256:a", 512 * 1024, 1024 * 1024, 0, 2);
        s.update("sha256:b", 0, 1024 * 1024, 0, 2);
        s.update("sha256:a", 1024 * 1024, 1024 * 1024, 1, 2);
        assert_eq!(s.bytes(), (1024 * 1024, 2 * 1024 * 1024));
        assert_eq!(s.stats(), "1.0 MiB / 2.0 MiB  layers 1/2");
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
    fn upload_stats_show_done_of_total() {
        assert_eq!(upload_stats(3 << 20, 12 << 20), "3.0 MiB / 12.0 MiB");
        // An estimate that came out short shows what was sent.
        assert_eq!(upload_stats(13 << 20, 12 << 20), "13.0 MiB");
    }
}

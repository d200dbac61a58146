//! The JSON-lines log of the orchestrator and the agent: a `tracing` subscriber that
//! writes one JSON object per line on stderr.
//!
//! A line has `ts` (RFC 3339, UTC, from `tracing-subscriber`'s clock), `level`
//! (`debug`, `info`, `warn`, `error`), `msg`, then the fields of every span the event
//! happened in, outermost first (`request_id`, `sandbox_id`, ...), then the event's own
//! fields. Every value is a string and the fields are flat, as the lines of the logger
//! this replaced were, so whatever reads the log needs no change:
//!
//! ```text
//! {"duration_ms":"0.412","level":"info","method":"GET","msg":"request","path":"/sandboxes/s1","request_id":"5f0c2a9e1b7d4c36","sandbox_id":"s1","status":"200","ts":"2026-12-04T08:01:02.345678Z"}
//! ```
//!
//! [`set_level`] installs the subscriber on first use and can change the level while
//! running (the tests quiet in-process servers, the benchmark turns the log back on).
//! A disabled level costs next to nothing: `tracing` caches per call site that nothing
//! listens.

use std::sync::{Arc, Mutex, OnceLock};
use std::{fmt, io};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{reload, Registry};

/// The handle that changes the installed subscriber's filter.
static FILTER: OnceLock<Option<reload::Handle<Targets, Registry>>> = OnceLock::new();

/// Sets the least level written: `debug`, `info`, `warn`, `error` or `off` apply to
/// Orchard's own crates (the crates it uses stay silent, as before `tracing`); a spec
/// with `=` is a list of `target=level` (`orchard=debug,hyper=info`); anything
/// else is `info`. Installs the subscriber on first call; if another global subscriber
/// was installed first, the call does nothing.
pub fn set_level(spec: &str) {
    let filter = filter(spec);
    let handle = FILTER.get_or_init(install);
    if let Some(h) = handle {
        // Fails only if the subscriber was dropped, which a global one never is.
        let _ = h.reload(filter);
    }
}

/// The filter `spec` means (see [`set_level`]). `Targets` rather than `EnvFilter`: the
/// same `target=level` lists without a regex engine in the static agent.
fn filter(spec: &str) -> Targets {
    let own = |level: LevelFilter| Targets::new().with_target("orchard", level);
    match spec.trim() {
        "trace" => own(LevelFilter::TRACE),
        "debug" => own(LevelFilter::DEBUG),
        "warn" | "warning" => own(LevelFilter::WARN),
        "error" => own(LevelFilter::ERROR),
        "off" | "none" => Targets::new(),
        s if s.contains('=') => s.parse().unwrap_or_else(|_| own(LevelFilter::INFO)),
        _ => own(LevelFilter::INFO),
    }
}

fn install() -> Option<reload::Handle<Targets, Registry>> {
    let (filter, handle) = reload::Layer::new(Targets::new());
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(layer(std::io::stderr));
    tracing::subscriber::set_global_default(subscriber)
        .ok()
        .map(|()| handle)
}

/// The line format writing to `writer`, as a layer of a registry.
fn layer<S, W>(writer: W) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .fmt_fields(JsonFields::new())
        .event_format(FlatJson)
        .with_writer(writer)
}

/// A subscriber writing the lines at level `spec` (as in [`set_level`]) to `writer`,
/// for a test to install with `tracing::subscriber::set_default` and read back (see
/// [`Capture`]).
pub fn subscriber<W>(spec: &str, writer: W) -> impl Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::registry()
        .with(filter(spec))
        .with(layer(writer))
}

/// Lines written into memory, for tests: pass a clone to [`subscriber`], then read
/// them with [`Capture::lines`].
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    /// Every line so far, each parsed as a JSON object; a line that is not one is an
    /// error naming it.
    pub fn lines(&self) -> Result<Vec<Map<String, Value>>, String> {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(|l| serde_json::from_str(l).map_err(|e| format!("{e}: {l}")))
            .collect()
    }
}

impl io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Capture {
    type Writer = Capture;

    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

/// The line format: one flat JSON object of strings (see the module header).
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let mut ts = String::new();
        SystemTime.format_time(&mut Writer::new(&mut ts))?;
        line.insert("ts".into(), ts.into());
        line.insert("level".into(), level_name(*event.metadata().level()).into());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                // The fmt layer keeps each span's fields as the JSON text `JsonFields`
                // wrote when the span was made (and on every `record`).
                if let Some(text) = ext.get::<FormattedFields<N>>() {
                    if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(text) {
                        for (k, v) in fields {
                            line.insert(k, stringify(v));
                        }
                    }
                }
            }
        }
        event.record(&mut Fields(&mut line));
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::TRACE => "trace",
        Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warn",
        Level::ERROR => "error",
    }
}

/// A JSON value as the string the line carries: strings as they are, anything else as
/// its JSON text (`200`, `true`).
fn stringify(v: Value) -> Value {
    match v {
        Value::String(_) => v,
        other => Value::String(other.to_string()),
    }
}

/// Collects an event's fields as strings; `message` becomes `msg`.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: String) {
        let name = match field.name() {
            "message" => "msg",
            n => n,
        };
        self.0.insert(name.to_string(), Value::String(value));
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.to_string());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.to_string());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.to_string());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%x` fields and the message arrive here; their Debug is their Display.
        self.put(field, format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(level: &str, f: impl FnOnce()) -> Vec<Map<String, Value>> {
        let buf = Capture::default();
        tracing::subscriber::with_default(subscriber(level, buf.clone()), f);
        buf.lines().unwrap()
    }

    #[test]
    fn a_line_is_flat_json_of_strings_with_the_fields_of_its_spans() {
        let lines = capture("info", || {
            let outer = tracing::info_span!("request", request_id = "r1");
            let _o = outer.enter();
            let inner = tracing::info_span!("create", sandbox_id = %"s1", cpus = 2);
            let _i = inner.enter();
            tracing::info!(status = 200u16, ok = true, "created {}", "it");
            tracing::debug!("not written at info");
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let l = &lines[0];
        assert_eq!(l["msg"], "created it");
        assert_eq!(l["level"], "info");
        assert_eq!(l["request_id"], "r1");
        assert_eq!(l["sandbox_id"], "s1");
        assert_eq!(l["cpus"], "2");
        assert_eq!(l["status"], "200");
        assert_eq!(l["ok"], "true");
        let ts = l["ts"].as_str().unwrap();
        assert!(
            ts.len() >= 20 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{ts}"
        );
    }

    #[test]
    fn levels_filter_as_the_old_logger_did() {
        let emit = || {
            tracing::debug!("d");
            tracing::info!("i");
            tracing::warn!("w");
        };
        let msgs = |level| {
            capture(level, emit)
                .iter()
                .map(|l| l["msg"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(msgs("debug"), ["d", "i", "w"]);
        assert_eq!(msgs("info"), ["i", "w"]);
        assert_eq!(msgs("bogus"), ["i", "w"]);
        assert_eq!(msgs("warning"), ["w"]);
        assert!(msgs("off").is_empty());
        assert_eq!(msgs("orchard_log=warn"), ["w"]);
    }
}

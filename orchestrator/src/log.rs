//! Structured logs: one JSON object per line on stderr, with a timestamp, a level, a
//! message and string fields (`request_id` on every request line). Small enough not to
//! need a logging framework; quiet (`ORCHARD_LOG=warn`) keeps only warnings.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

static MIN_LEVEL: AtomicU8 = AtomicU8::new(1);

/// Sets the least level written: `debug`, `info` (default), `warn`, `off`.
pub fn set_level(level: &str) {
    let l = match level {
        "debug" => 0,
        "warn" | "warning" => 2,
        "off" | "none" => 3,
        _ => 1,
    };
    MIN_LEVEL.store(l, Ordering::Relaxed);
}

fn write(level: u8, name: &str, msg: &str, fields: &[(&str, &str)]) {
    if level < MIN_LEVEL.load(Ordering::Relaxed) {
        return;
    }
    let mut obj = serde_json::Map::new();
    obj.insert("ts".into(), crate::service::now_iso().into());
    obj.insert("level".into(), name.into());
    obj.insert("msg".into(), msg.into());
    for (k, v) in fields {
        obj.insert((*k).into(), (*v).into());
    }
    let mut line = serde_json::Value::Object(obj).to_string();
    line.push('\n');
    // One write call per line keeps concurrent lines whole.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// A debug line.
pub fn debug(msg: &str, fields: &[(&str, &str)]) {
    write(0, "debug", msg, fields)
}

/// An info line.
pub fn info(msg: &str, fields: &[(&str, &str)]) {
    write(1, "info", msg, fields)
}

/// A warning line.
pub fn warn(msg: &str, fields: &[(&str, &str)]) {
    write(2, "warn", msg, fields)
}

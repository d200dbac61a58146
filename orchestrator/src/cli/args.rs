//! Parsing of the values people type: `KEY=VALUE` pairs and durations.

use std::time::Duration;

/// Parses `KEY=VALUE` (the value may be empty and may contain `=`; the key may not be
/// empty). Used as a clap `value_parser`, so the error is a plain message.
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some(("", _)) => Err(format!("{s:?}: the key before `=` is empty")),
        Some((key, value)) => Ok((key.to_string(), value.to_string())),
        None => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// Parses a duration: a number of seconds (`30`, `1.5`) or a number with a unit
/// (`500ms`, `30s`, `15m`, `2h`, `1d`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (like 30, 1.5, 500ms, 15m, 2h)"))?;
    let scale = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 0.001,
        "m" | "min" | "mins" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => return Err(format!("{s:?}: unknown unit {other:?} (ms, s, m, h or d)")),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|_| format!("{s:?} is out of range"))
}

/// Whole seconds of `d`, rounded up so that `500ms` does not become "no limit" (0).
pub fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_split_at_the_first_equals() {
        assert_eq!(
            parse_key_value("a=b").unwrap(),
            ("a".to_string(), "b".to_string())
        );
        assert_eq!(
            parse_key_value("PATH=/a:/b=c").unwrap(),
            ("PATH".to_string(), "/a:/b=c".to_string())
        );
        assert_eq!(
            parse_key_value("EMPTY=").unwrap(),
            ("EMPTY".to_string(), String::new())
        );
        assert!(parse_key_value("novalue").is_err());
        assert!(parse_key_value("=value").is_err());
        assert!(parse_key_value("").is_err());
    }

    #[test]
    fn durations_take_seconds_or_a_unit() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration(" 1d ").unwrap(), Duration::from_secs(86_400));
        for bad in ["", "soon", "5y", "-3", "1e999", "m", "1.2.3"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn whole_seconds_round_up() {
        assert_eq!(whole_seconds(Duration::from_millis(500)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(60)), 60);
        assert_eq!(whole_seconds(Duration::ZERO), 0);
    }
}

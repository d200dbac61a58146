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

/// Calendar units `humantime` knows but a sandbox's lifetime or time limit has no use
/// for; refused because `5M` (months) is one shift key away from `5m` (minutes).
const CALENDAR_UNITS: &[&str] = &["M", "month", "months", "y", "yr", "yrs", "year", "years"];

/// Parses a duration: a number of seconds (`30`, `1.5`) or `humantime`'s spans (`500ms`,
/// `30s`, `1.5m`, `15min`, `2h`, `1d`, `1w`, `1h 30m`, `2hours`). Months and years are
/// refused (`5M` is too close to `5m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, rest) = t.split_at(split);
    if rest.is_empty() {
        // A bare number is seconds; humantime wants a unit on everything but `0`.
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{s:?} is not a duration (like 30, 1.5, 500ms, 15m, 2h)"))?;
        return Duration::try_from_secs_f64(value).map_err(|_| format!("{s:?} is out of range"));
    }
    if let Some(unit) = t
        .split(|c: char| !c.is_alphabetic())
        .find(|word| CALENDAR_UNITS.contains(word))
    {
        return Err(format!(
            "{s:?}: {unit:?} is a calendar unit; use ms, s, m, h, d or w"
        ));
    }
    // `12.5m` as humantime writes it; `.5m` and `12.m` were taken before it.
    let span = match number.strip_suffix('.').unwrap_or(number) {
        n if n.starts_with('.') && n.len() > 1 => format!("0{n}{rest}"),
        n if !n.is_empty() => format!("{n}{rest}"),
        _ => t.to_string(),
    };
    humantime::parse_duration(&span)
        .map_err(|e| format!("{s:?} is not a duration (like 30, 1.5, 500ms, 15m, 2h, 1h 30m): {e}"))
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
    fn durations_take_humantime_spans_but_no_calendar_units() {
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2hours").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1w").unwrap(), Duration::from_secs(604_800));
        assert_eq!(parse_duration("1.5m").unwrap(), Duration::from_secs(90));
        for bad in ["5M", "1month", "2 years", "1h 1y", "5 s soon", ".s", "."] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

    /// The parser before `humantime`, kept as an oracle: every form it took must still
    /// parse, to the same duration.
    fn legacy(s: &str) -> Option<Duration> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let value: f64 = number.parse().ok()?;
        let scale = match unit.trim() {
            "" | "s" | "sec" | "secs" => 1.0,
            "ms" => 0.001,
            "m" | "min" | "mins" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            _ => return None,
        };
        Duration::try_from_secs_f64(value * scale).ok()
    }

    #[test]
    fn durations_accept_everything_the_old_parser_did() {
        let numbers = ["0", "1", "30", "1.5", "0.25", "12.", ".5", "86400", "2.125"];
        let units = [
            "", "s", "sec", "secs", "ms", "m", "min", "mins", "h", "d", " s", " min",
        ];
        for number in numbers {
            for unit in units {
                for form in [format!("{number}{unit}"), format!(" {number}{unit} ")] {
                    let old = legacy(&form).unwrap_or_else(|| panic!("{form:?}"));
                    let new = parse_duration(&form).unwrap_or_else(|e| panic!("{e}"));
                    // f64 scaling rounds in the last nanosecond; humantime is exact.
                    let diff = old.abs_diff(new);
                    assert!(
                        diff <= Duration::from_nanos(1),
                        "{form:?}: {old:?} vs {new:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn whole_seconds_round_up() {
        assert_eq!(whole_seconds(Duration::from_millis(500)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(60)), 60);
        assert_eq!(whole_seconds(Duration::ZERO), 0);
    }
}

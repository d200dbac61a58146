//! Wall-clock helpers shared by the service and the backends: milliseconds and seconds
//! since the epoch, and RFC 3339 in UTC with millisecond precision
//! (`2026-12-04T07:48:37.123Z`, the one timestamp format on the wire), formatted by
//! `humantime`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The last millisecond RFC 3339 can write with four year digits
/// (`9999-12-31T23:59:59.999Z`); `humantime` refuses later times.
const LAST_MS: u64 = 253_402_300_800_000 - 1;

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Now, Unix epoch seconds (the compatible API's timestamps).
pub fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `unix_ms` as RFC 3339 in UTC, millisecond precision. Times past the year 9999 (a
/// file's modification time is whatever a sandbox set) are written as its last
/// millisecond rather than failing.
pub fn rfc3339(unix_ms: u64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(unix_ms.min(LAST_MS));
    humantime::format_rfc3339_millis(at).to_string()
}

/// Now, RFC 3339 in UTC, millisecond precision.
pub fn now_rfc3339() -> String {
    rfc3339(now_ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_has_millis_and_a_z() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_735_689_599_999), "2024-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(1_796_370_517_120), "2026-12-04T07:48:37.120Z");
        assert_eq!(rfc3339(LAST_MS), "9999-12-31T23:59:59.999Z");
        // Past what four year digits hold: clamped, never a panic.
        assert_eq!(rfc3339(LAST_MS + 1), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(now_rfc3339().len(), "1970-01-01T00:00:00.000Z".len());
    }
}

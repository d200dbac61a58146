//! Kubernetes-style quantities as the compatible API takes them: CPU like `"4"`,
//! `"0.5"` or `"2000m"`, memory like `"16Gi"`, `"512Mi"`, `"1G"` or plain bytes.
//!
//! A leaf of the crate: the service checks a create's limits with it, the
//! configuration its defaults, the Kubernetes backend its node's capacity; it imports
//! none of them.

/// A quantity that does not parse or is out of range; its message is the one the client
/// gets (the service answers it as a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QuantityError(String);

/// CPU cores from `"4"`, `"0.5"` or `"2000m"`.
pub fn parse_cpu(s: &str) -> Result<f64, QuantityError> {
    let bad = || {
        QuantityError(format!(
            "cpu {s:?}: use cores like \"2\" or \"0.5\", or millicores like \"500m\""
        ))
    };
    let t = s.trim();
    let v = match t.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().map_err(|_| bad())? / 1000.0,
        None => t.parse::<f64>().map_err(|_| bad())?,
    };
    if !v.is_finite() || !(0.01..=1024.0).contains(&v) {
        return Err(QuantityError(format!(
            "cpu {s:?}: must be between 0.01 and 1024 cores"
        )));
    }
    Ok(v)
}

/// Bytes from `"16Gi"`, `"512Mi"`, `"1G"`, `"100k"` or `"1048576"`.
pub fn parse_memory(s: &str) -> Result<u64, QuantityError> {
    let bad = || {
        QuantityError(format!(
            "memory {s:?}: use bytes or a quantity like \"512Mi\", \"16Gi\" or \"1G\""
        ))
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    let bytes = n * mult;
    // Below 16 MiB the sandbox's own init and agent cannot start.
    if !bytes.is_finite() || bytes < (16 << 20) as f64 || bytes > (1u64 << 50) as f64 {
        return Err(QuantityError(format!(
            "memory {s:?}: must be between 16Mi and 1Pi"
        )));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quantities() {
        assert_eq!(parse_cpu("4").unwrap(), 4.0);
        assert_eq!(parse_cpu("2000m").unwrap(), 2.0);
        assert_eq!(parse_cpu("0.5").unwrap(), 0.5);
        assert!(parse_cpu("lots").is_err());
        assert!(parse_cpu("0").is_err());
        assert!(parse_cpu("-1").is_err());
    }

    #[test]
    fn memory_quantities() {
        assert_eq!(parse_memory("16Gi").unwrap(), 16 << 30);
        assert_eq!(parse_memory("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse_memory("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_memory("16777216").unwrap(), 16 << 20);
        assert!(parse_memory("12 parsecs").is_err());
        assert!(parse_memory("1Ki").is_err(), "too small to run anything");
        assert!(parse_memory("").is_err());
    }

    /// Commit bedc559: 8Mi passed validation and the create failed later with a 502.
    #[test]
    fn regression_memory_under_16mi_is_refused_up_front() {
        assert!(parse_memory("8Mi").is_err());
        assert!(parse_memory("16Mi").is_ok());
    }
}

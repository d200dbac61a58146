//! Kubernetes-style quantities: CPU like `"4"`, `"0.5"` or `"2000m"`, memory like
//! `"16Gi"`, `"512Mi"`, `"1G"` or plain bytes, as the compatible API takes them
//! ([`parse_cpu`], [`parse_memory`], range-checked), and any quantity the API server
//! writes (`"15944672Ki"`, `"1e3"`, `"100u"`: [`quantity`], [`cpu_millis`],
//! [`bytes`]).
//!
//! A leaf of the crate: the service checks a create's limits with it, the
//! configuration its defaults, the Kubernetes backend its nodes' capacity and its
//! pods' requests; it imports none of them.

/// A quantity that does not parse or is out of range; its message is the one the client
/// gets (the service answers it as a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QuantityError(String);

/// The value of a quantity in any form Kubernetes writes or takes: a decimal number
/// (`"4"`, `"0.5"`, `".5"`, `"+1"`), then a binary suffix (`Ki` to `Ei`), a decimal one
/// (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`; also `K`, which this API has always
/// taken for memory) or an exponent (`"1e3"`, `"5E-1"`; `"1E"` alone is an exa). Only
/// finite values of zero or more: nothing read here (a node's capacity, a pod's
/// request, a create's limit) is negative.
pub fn quantity(s: &str) -> Result<f64, QuantityError> {
    let bad = || {
        QuantityError(format!(
            "{s:?} is not a quantity (like \"500m\", \"4\", \"16Gi\" or \"1e3\")"
        ))
    };
    let t = s.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    // `f64::from_str` alone would take "inf", "NaN" and "-1"; the split keeps to digits.
    if !num.bytes().any(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: f64 = num.parse().map_err(|_| bad())?;
    const KI: f64 = 1024.0;
    // Fractions divide instead of multiplying by an inexact 0.001, so "3800m" is 3.8
    // and not 3.8000000000000003.
    let v = match suffix {
        "" => n,
        "n" => n / 1e9,
        "u" => n / 1e6,
        "m" => n / 1e3,
        "k" | "K" => n * 1e3,
        "M" => n * 1e6,
        "G" => n * 1e9,
        "T" => n * 1e12,
        "P" => n * 1e15,
        "E" => n * 1e18,
        "Ki" => n * KI,
        "Mi" => n * KI * KI,
        "Gi" => n * KI * KI * KI,
        "Ti" => n * KI * KI * KI * KI,
        "Pi" => n * KI * KI * KI * KI * KI,
        "Ei" => n * KI * KI * KI * KI * KI * KI,
        e => {
            let exp = e
                .strip_prefix(['e', 'E'])
                .filter(|x| !x.is_empty())
                .and_then(|x| x.parse::<i32>().ok())
                .ok_or_else(bad)?;
            if exp < 0 {
                n / 10f64.powi(exp.saturating_neg())
            } else {
                n * 10f64.powi(exp)
            }
        }
    };
    if !v.is_finite() {
        return Err(bad());
    }
    Ok(v)
}

/// `v` as a whole number, rounded up as Kubernetes rounds quantities (a request of
/// `"0.1m"` CPU is 1 millicore), except that what is a whole number but for the last
/// bits of a float (`3799.9999999999995`) is that number.
fn whole_up(v: f64) -> u64 {
    let r = v.round();
    if (v - r).abs() < 1e-6 {
        r as u64
    } else {
        v.ceil() as u64
    }
}

/// Millicores of a CPU quantity (`"3800m"` is 3800, `"2"` 2000): sums of these are
/// exact, where sums of fractional cores are not (`0.1 + 0.2`).
pub fn cpu_millis(s: &str) -> Result<u64, QuantityError> {
    Ok(whole_up(quantity(s)? * 1000.0))
}

/// Bytes of a memory quantity (`"15944672Ki"`, `"8Gi"`, `"129e6"`), of any size.
pub fn bytes(s: &str) -> Result<u64, QuantityError> {
    Ok(whole_up(quantity(s)?))
}

/// CPU cores from `"4"`, `"0.5"` or `"2000m"`.
pub fn parse_cpu(s: &str) -> Result<f64, QuantityError> {
    let v = quantity(s).map_err(|_| {
        QuantityError(format!(
            "cpu {s:?}: use cores like \"2\" or \"0.5\", or millicores like \"500m\""
        ))
    })?;
    if !(0.01..=1024.0).contains(&v) {
        return Err(QuantityError(format!(
            "cpu {s:?}: must be between 0.01 and 1024 cores"
        )));
    }
    Ok(v)
}

/// Bytes from `"16Gi"`, `"512Mi"`, `"1G"`, `"100k"` or `"1048576"`.
pub fn parse_memory(s: &str) -> Result<u64, QuantityError> {
    let v = quantity(s).map_err(|_| {
        QuantityError(format!(
            "memory {s:?}: use bytes or a quantity like \"512Mi\", \"16Gi\" or \"1G\""
        ))
    })?;
    // Below 16 MiB the sandbox's own init and agent cannot start.
    if v < (16 << 20) as f64 || v > (1u64 << 50) as f64 {
        return Err(QuantityError(format!(
            "memory {s:?}: must be between 16Mi and 1Pi"
        )));
    }
    Ok(whole_up(v))
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

    /// What the API server writes in a node's status and a pod's requests, odd forms
    /// included: read without the compatible API's range checks.
    #[test]
    fn kubernetes_quantities_in_every_form() {
        assert_eq!(cpu_millis("3800m").unwrap(), 3800);
        assert_eq!(cpu_millis("2").unwrap(), 2000);
        assert_eq!(cpu_millis("0.1").unwrap(), 100);
        assert_eq!(cpu_millis(".5").unwrap(), 500);
        assert_eq!(cpu_millis("+1").unwrap(), 1000);
        assert_eq!(cpu_millis("0").unwrap(), 0);
        assert_eq!(cpu_millis("2048").unwrap(), 2_048_000, "no 1024-core cap");
        assert_eq!(
            cpu_millis("100u").unwrap(),
            1,
            "rounded up, as Kubernetes does"
        );
        assert_eq!(cpu_millis("250000000n").unwrap(), 250);
        assert_eq!(cpu_millis("5e-1").unwrap(), 500);
        assert_eq!(bytes("15944672Ki").unwrap(), 15_944_672 * 1024);
        assert_eq!(bytes("8Gi").unwrap(), 8 << 30);
        assert_eq!(bytes("129e6").unwrap(), 129_000_000);
        assert_eq!(
            bytes("1E").unwrap(),
            1_000_000_000_000_000_000,
            "E alone is exa"
        );
        assert_eq!(bytes("1Ei").unwrap(), 1 << 60);
        assert_eq!(bytes("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(bytes("0").unwrap(), 0);
        assert_eq!(bytes("1k").unwrap(), 1000);
        assert_eq!(bytes(" 64Mi ").unwrap(), 64 << 20);
        for bad in [
            "", "-1", "Gi", "1.2.3", "1e", "1e+", "1Qi", "inf", "NaN", "1e999", "1 Gi",
        ] {
            assert!(quantity(bad).is_err(), "{bad:?} parsed");
        }
    }

    /// Commit bedc559: 8Mi passed validation and the create failed later with a 502.
    #[test]
    fn regression_memory_under_16mi_is_refused_up_front() {
        assert!(parse_memory("8Mi").is_err());
        assert!(parse_memory("16Mi").is_ok());
    }
}

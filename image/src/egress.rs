//! What "egress" means: the internet, not the machine's own networks.
//!
//! A sandbox allowed egress, and an image pull, may reach any public address but none of
//! the ranges that lead into the operator's own infrastructure: private networks
//! (10/8, 172.16/12, 192.168/16, carrier-grade NAT 100.64/10, fc00::/7), link-local
//! (169.254/16 with the clouds' metadata service at 169.254.169.254, fe80::/10),
//! loopback and "this network" (0/8: a connect to 0.0.0.0 reaches the connecting host),
//! multicast and reserved space. The operator opens some of them again with
//! [`EgressPolicy::allow`] (`--egress-allow-cidr`, e.g. a package mirror on 10.1.2.3/32).
//!
//! Each backend enforces the policy its own way (the local backend with firewall rules
//! in the sandbox's network namespace, Kubernetes with the NetworkPolicy's `except`);
//! this module only says which addresses are out, so both say the same.

use std::net::IpAddr;
use std::str::FromStr;

pub use ipnet::IpNet;

/// IPv4 ranges a sandbox's egress may not reach unless allowed.
pub const DENIED_V4: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
];

/// IPv6 ranges a sandbox's egress may not reach unless allowed.
pub const DENIED_V6: &[&str] = &[
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b:1::/48",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// A bad `--egress-allow-cidr`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a CIDR such as 10.1.0.0/16 or 192.168.1.7/32")]
pub struct BadCidr(pub String);

/// Which non-public ranges the operator opened again for sandboxes and pulls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Ranges reachable although denied; empty by default.
    pub allow: Vec<IpNet>,
}

impl EgressPolicy {
    /// A policy allowing `cidrs` (each `ADDR/LEN`; a bare address means that address).
    pub fn parse<S: AsRef<str>>(cidrs: &[S]) -> Result<EgressPolicy, BadCidr> {
        let allow = cidrs
            .iter()
            .map(|c| {
                let c = c.as_ref().trim();
                IpNet::from_str(c)
                    .or_else(|_| IpAddr::from_str(c).map(IpNet::from))
                    .map(|n| n.trunc())
                    .map_err(|_| BadCidr(c.to_string()))
            })
            .collect::<Result<_, _>>()?;
        Ok(EgressPolicy { allow })
    }

    /// Whether `ip` is in a denied range and not allowed.
    pub fn refuses(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        denied().iter().any(|net| net.contains(&ip)) && !self.allow.iter().any(|a| a.contains(&ip))
    }
}

/// The denied ranges, parsed.
pub fn denied() -> Vec<IpNet> {
    DENIED_V4
        .iter()
        .chain(DENIED_V6)
        .filter_map(|c| IpNet::from_str(c).ok())
        .collect()
}

/// An IPv4-mapped IPv6 address as the IPv4 address it names, so `::ffff:10.0.0.1` is
/// judged as 10.0.0.1.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_link_local_and_loopback_are_refused_public_is_not() {
        let p = EgressPolicy::default();
        for bad in [
            "10.1.2.3",
            "172.31.255.1",
            "192.168.0.1",
            "100.100.100.200",
            "169.254.169.254",
            "127.0.0.1",
            "0.0.0.0",
            "fd00::1",
            "fe80::1",
            "::1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(p.refuses(bad.parse().unwrap()), "{bad}");
        }
        for good in ["1.1.1.1", "172.32.0.1", "192.0.2.1", "2606:4700::1111"] {
            assert!(!p.refuses(good.parse().unwrap()), "{good}");
        }
        assert_eq!(denied().len(), DENIED_V4.len() + DENIED_V6.len());
    }

    #[test]
    fn allowed_cidrs_open_their_range_only() {
        let p = EgressPolicy::parse(&["10.1.0.0/16", " 192.168.1.7 ", "fd00::5/128"]).unwrap();
        assert!(!p.refuses("10.1.200.3".parse().unwrap()));
        assert!(p.refuses("10.2.0.1".parse().unwrap()));
        assert!(!p.refuses("192.168.1.7".parse().unwrap()));
        assert!(p.refuses("192.168.1.8".parse().unwrap()));
        assert!(!p.refuses("fd00::5".parse().unwrap()));
        // Host bits are dropped: 10.1.2.3/16 means 10.1.0.0/16.
        let p = EgressPolicy::parse(&["10.1.2.3/16"]).unwrap();
        assert_eq!(p.allow[0].to_string(), "10.1.0.0/16");
        for bad in ["", "10.0.0.0/33", "example.com", "10.0.0/8"] {
            assert!(EgressPolicy::parse(&[bad]).is_err(), "{bad:?}");
        }
    }
}

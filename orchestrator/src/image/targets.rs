//! Which hosts a pull may reach. An image reference names its registry, so any key could
//! make the server fetch from any address: the loopback interface (the server's own
//! API, a local Redis), link-local metadata services (`169.254.169.254`). With the
//! policy on (`orchard serve` turns it on), a registry, a token realm or a redirect
//! target that is, or resolves to, a loopback, link-local or unspecified address is
//! refused unless the operator listed its host (`--allow-registry`); mirrors the
//! operator configured are listed by the server. Names are checked when they resolve
//! (a resolver that drops such addresses), so a redirect or a DNS answer that changes
//! between check and connect cannot get around it; IP literals, which reqwest does not
//! resolve, are checked by [`TargetPolicy::check_url`] before every request and redirect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The policy. The default allows everything (the image store as a library, tests).
#[derive(Debug, Clone, Default)]
pub struct TargetPolicy {
    /// Refuse loopback, link-local and unspecified targets not listed in `allowed`.
    pub restrict: bool,
    /// Hosts (`host` or `host:port`; a bare host allows every port) allowed anyway.
    pub allowed: Vec<String>,
}

/// An address no registry named by a client may have.
pub fn forbidden(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

impl TargetPolicy {
    /// Whether `host` (with or without `:port`) is listed, or the policy is off.
    pub fn allows_host(&self, host: &str, port: Option<u16>) -> bool {
        if !self.restrict {
            return true;
        }
        let with_port = port.map(|p| format!("{host}:{p}"));
        self.allowed.iter().any(|a| {
            let a = a
                .trim()
                .trim_start_matches("http://")
                .trim_start_matches("https://");
            let a = a.trim_end_matches('/');
            a == host
                || a.trim_start_matches('[').trim_end_matches(']') == host
                || with_port.as_deref() == Some(a)
        })
    }

    /// Refuses `url` when its host is a forbidden IP literal that is not listed.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        let Some(host) = url.host_str() else {
            return Err(format!("{url}: no host"));
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if self.allows_host(bare, url.port_or_known_default()) {
            return Ok(());
        }
        match bare.parse::<IpAddr>() {
            Ok(ip) if forbidden(ip) => Err(refusal(bare)),
            _ => Ok(()),
        }
    }
}

fn refusal(host: &str) -> String {
    format!(
        "{host} is a loopback or link-local address, which pulls may not reach unless the \
         operator allows it (orchard serve --allow-registry {host})"
    )
}

/// A resolver that drops forbidden addresses of hosts the policy does not list.
pub struct GuardedResolver(pub Arc<TargetPolicy>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept: Vec<SocketAddr> = if policy.allows_host(&host, None) {
                addrs
            } else {
                addrs.into_iter().filter(|a| !forbidden(a.ip())).collect()
            };
            if kept.is_empty() {
                return Err(refusal(&host).into());
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_link_local_and_unspecified_are_refused_unless_listed() {
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "169.254.169.254",
            "fe80::1",
            "0.0.0.0",
            "::ffff:127.0.0.1",
        ] {
            assert!(forbidden(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "10.0.0.1", "2001:db8::1"] {
            assert!(!forbidden(ip.parse().unwrap()), "{ip}");
        }
        let p = TargetPolicy {
            restrict: true,
            allowed: vec!["127.0.0.1:5000".into(), "localhost".into()],
        };
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(p.check_url(&url("http://127.0.0.1:5000/v2/")).is_ok());
        assert!(p.check_url(&url("http://127.0.0.1:5001/v2/")).is_err());
        assert!(p.check_url(&url("http://169.254.169.254/latest")).is_err());
        assert!(p.check_url(&url("http://[::1]:8000/")).is_err());
        assert!(p
            .check_url(&url("https://registry-1.docker.io/v2/"))
            .is_ok());
        assert!(p.allows_host("localhost", Some(8000)));
        assert!(TargetPolicy::default()
            .check_url(&url("http://127.0.0.1:1/"))
            .is_ok());
    }
}

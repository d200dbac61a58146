//! Which hosts a pull may reach. An image reference names its registry, so any key could
//! make the server fetch from any address: the loopback interface (the server's own
//! API, a local Redis), link-local metadata services (`169.254.169.254`), the private
//! networks around the host. With the policy on (`orchard serve` turns it on), a
//! registry, a token realm or a redirect target that is, or resolves to, a loopback,
//! link-local, unspecified or private address is refused unless the operator listed its
//! host (`--allow-registry`) or opened its range (`--egress-allow-cidr`); mirrors the
//! operator configured are listed by the server. Transport failures all read alike
//! ([`connect_failure`]), so pulls do not tell open ports from closed ones. Names are checked when they resolve
//! (a resolver that drops such addresses), so a redirect or a DNS answer that changes
//! between check and connect cannot get around it; IP literals, which reqwest does not
//! resolve, are checked by [`TargetPolicy::check_url`] before every request and redirect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The policy. The default allows everything (the image store as a library, tests).
#[derive(Debug, Clone, Default)]
pub struct TargetPolicy {
    /// Refuse non-public targets (see [`forbidden`]) not listed in `allowed` nor in
    /// `egress`'s allowed ranges.
    pub restrict: bool,
    /// Hosts (`host` or `host:port`; a bare host allows every port) allowed anyway.
    pub allowed: Vec<String>,
    /// Ranges the operator opened for egress (`--egress-allow-cidr`): pulls may reach
    /// them too.
    pub egress: crate::egress::EgressPolicy,
}

/// An address no registry named by a client may have: loopback, link-local (cloud
/// metadata), unspecified, private (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7)
/// and the rest of what egress means not to reach (see [`crate::egress`]).
pub fn forbidden(ip: IpAddr) -> bool {
    crate::egress::EgressPolicy::default().refuses(ip)
}

/// What a pull says when a connection failed at the transport, whatever the cause:
/// a refused connection, a reset, an unreachable network or a time-out all read the
/// same, so a pull cannot be used to scan which ports of an address are open. The
/// policy's own refusal keeps its text: it says what the operator can do.
pub fn connect_failure(err: &reqwest::Error) -> String {
    let full = crate::error::chain(err);
    if full.contains(REFUSAL_MARK) || !(err.is_connect() || err.is_timeout()) {
        return full;
    }
    "could not connect, or no answer in time".to_string()
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

    /// Whether `ip` is refused for a host the policy does not list.
    fn refuses(&self, ip: IpAddr) -> bool {
        forbidden(ip) && self.egress.refuses(ip)
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
            Ok(ip) if self.refuses(ip) => Err(refusal(bare)),
            _ => Ok(()),
        }
    }
}

/// Part of every refusal's text, to tell it from a transport error.
const REFUSAL_MARK: &str = "which pulls may not reach";

fn refusal(host: &str) -> String {
    format!(
        "{host} is a loopback or link-local address or a private one, {REFUSAL_MARK} unless \
         the operator allows it (orchard serve --allow-registry {host})"
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
                addrs
                    .into_iter()
                    .filter(|a| !policy.refuses(a.ip()))
                    .collect()
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

    /// Issue 30, point 8: a refused port and one that never answers read the same.
    #[tokio::test]
    async fn a_closed_port_and_a_silent_one_fail_with_the_same_words() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        // Accepts (the kernel's backlog) and never answers: a filtered or slow port.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_port = silent.local_addr().unwrap().port();
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_millis(300))
            .build()
            .unwrap();
        let mut said = Vec::new();
        for port in [closed_port, silent_port] {
            let err = client
                .get(format!("http://127.0.0.1:{port}/v2/"))
                .send()
                .await
                .unwrap_err();
            said.push(connect_failure(&err));
        }
        assert_eq!(said[0], said[1], "{said:?}");
        assert!(
            !said[0].contains("refused") && !said[0].contains("os error"),
            "{said:?}"
        );
        drop(silent);
    }

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
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "100.64.0.1",
            "fd00::1",
        ] {
            assert!(forbidden(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "2001:db8::1"] {
            assert!(!forbidden(ip.parse().unwrap()), "{ip}");
        }
        let p = TargetPolicy {
            restrict: true,
            allowed: vec!["127.0.0.1:5000".into(), "localhost".into()],
            egress: Default::default(),
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
        // Private ranges are refused unless the operator opened them for egress.
        assert!(p.check_url(&url("http://10.1.2.3:5000/v2/")).is_err());
        assert!(p.check_url(&url("http://192.168.0.9/v2/")).is_err());
        let opened = TargetPolicy {
            egress: crate::egress::EgressPolicy::parse(&["10.1.0.0/16"]).unwrap(),
            ..p.clone()
        };
        assert!(opened.check_url(&url("http://10.1.2.3:5000/v2/")).is_ok());
        assert!(opened.check_url(&url("http://10.2.0.1/v2/")).is_err());
    }
}

//! [`Endpoint`] as people and the `/v1` API write it: `unix:PATH` or `http://ip:port`.

use std::fmt;

use crate::Endpoint;

impl Endpoint {
    /// The TCP endpoint of an `http://ip:port` URL (the `url` of a `/v1` sandbox's
    /// `agent`, a pod IP); `None` for anything else.
    pub fn parse_http_url(url: &str) -> Option<Endpoint> {
        let rest = url.strip_prefix("http://")?.trim_end_matches('/');
        rest.parse().ok().map(Endpoint::Tcp)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "http://{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_parse_and_endpoints_print_as_written() {
        let tcp = Endpoint::parse_http_url("http://10.1.2.3:7070/").unwrap();
        assert_eq!(tcp, Endpoint::Tcp("10.1.2.3:7070".parse().unwrap()));
        assert_eq!(tcp.to_string(), "http://10.1.2.3:7070");
        for bad in [
            "https://10.1.2.3:7070",
            "http://agent:7070",
            "10.1.2.3:7070",
        ] {
            assert_eq!(Endpoint::parse_http_url(bad), None, "{bad}");
        }
        let unix = Endpoint::Unix("/run/a.sock".into());
        assert_eq!(unix.to_string(), "unix:/run/a.sock");
    }
}

//! Image references, normalised the way Docker does it.
//!
//! `python:3.11-slim` is `docker.io/library/python:3.11-slim`: a first path component is a
//! registry host only when it has a `.` or a `:` or is `localhost`, everything else lives
//! on Docker Hub, whose one-component names are in `library/`, and the tag defaults to
//! `latest` unless a digest is given. The normalised form is the store's key for an image,
//! so `busybox`, `busybox:latest` and `docker.io/library/busybox:latest` are one image.

use std::fmt;

use super::{digest, ImageError};

/// The registry unqualified names resolve to.
pub const DOCKER_HUB: &str = "docker.io";
/// The host that actually serves Docker Hub's registry API.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// Tag used when a reference names neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";
/// Longest repository name Docker accepts.
const MAX_NAME: usize = 255;
/// Longest tag Docker accepts.
const MAX_TAG: usize = 128;

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// Registry host, with port if any (`docker.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// Repository path in that registry (`library/python`).
    pub repository: String,
    /// Tag, if any (always set when there is no digest).
    pub tag: Option<String>,
    /// Manifest digest (`sha256:...`), if pinned.
    pub digest: Option<String>,
}

impl Reference {
    /// Parses and normalises `text`.
    pub fn parse(text: &str) -> Result<Reference, ImageError> {
        let invalid = |reason: &str| ImageError::InvalidReference {
            reference: text.to_string(),
            reason: reason.to_string(),
        };
        if text.is_empty() {
            return Err(invalid("it is empty"));
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("it contains whitespace or control characters"));
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => {
                digest::hex_of(digest).map_err(|_| {
                    invalid("the digest must be sha256: and 64 lowercase hex digits")
                })?;
                (rest, Some(digest.to_string()))
            }
            None => (text, None),
        };
        // A tag is after the last ':' that follows the last '/' (a ':' before it is a port).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(tag) = tag {
            if !valid_tag(tag) {
                return Err(invalid(
                    "a tag is 1 to 128 of [A-Za-z0-9_.-] and does not start with . or -",
                ));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let registry = match registry.as_str() {
            "index.docker.io" | DOCKER_HUB_API => DOCKER_HUB.to_string(),
            _ => registry,
        };
        if !valid_host(&registry) {
            return Err(invalid(
                "the registry must be a host name or address, with an optional port",
            ));
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if repository.is_empty() || repository.len() > MAX_NAME {
            return Err(invalid("the repository name must be 1 to 255 characters"));
        }
        if !repository.split('/').all(valid_component) {
            return Err(invalid(
                "repository path components are lowercase letters and digits, separated by . _ __ or -",
            ));
        }
        let tag = match (tag, &digest) {
            (Some(tag), _) => Some(tag.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some(DEFAULT_TAG.to_string()),
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What names the manifest in the registry API: the digest if pinned, else the tag.
    pub fn manifest_ref(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or(DEFAULT_TAG)
    }

    /// The same repository at another tag, replacing tag and digest.
    pub fn with_tag(&self, tag: &str) -> Result<Reference, ImageError> {
        Reference::parse(&format!("{}/{}:{tag}", self.registry, self.repository))
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

fn valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
        && tag.len() <= MAX_TAG
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// `[a-z0-9]+` runs joined by `.`, `_`, `__` or runs of `-`.
fn valid_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let separator = &component[start..i];
        let ok = separator == "."
            || separator == "_"
            || separator == "__"
            || separator.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}

fn valid_host(host: &str) -> bool {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        // [ipv6]:port
        match rest.split_once(']') {
            Some((addr, tail)) => {
                if !addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
                    return false;
                }
                match tail {
                    "" => return true,
                    tail => ("x", tail.strip_prefix(':')),
                }
            }
            None => return false,
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    let name_ok = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    let port_ok = match port {
        None => true,
        Some(port) => {
            !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
        }
    };
    name_ok && port_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(text: &str) -> String {
        match Reference::parse(text) {
            Ok(reference) => reference.to_string(),
            Err(err) => panic!("{text}: {err}"),
        }
    }

    #[test]
    fn normalises_like_docker() {
        assert_eq!(
            norm("python:3.11-slim"),
            "docker.io/library/python:3.11-slim"
        );
        assert_eq!(norm("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("library/busybox"), "docker.io/library/busybox:latest");
        assert_eq!(
            norm("docker.io/busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            norm("index.docker.io/library/busybox:1"),
            "docker.io/library/busybox:1"
        );
        assert_eq!(norm("someone/tool:v1.2"), "docker.io/someone/tool:v1.2");
        assert_eq!(norm("ghcr.io/org/repo/sub:tag"), "ghcr.io/org/repo/sub:tag");
        assert_eq!(
            norm("127.0.0.1:5000/busybox"),
            "127.0.0.1:5000/busybox:latest"
        );
        assert_eq!(norm("localhost/x"), "localhost/x:latest");
        assert_eq!(norm("localhost:5000/a/b:c"), "localhost:5000/a/b:c");
        assert_eq!(norm("[::1]:5000/a:b"), "[::1]:5000/a:b");
        let digest = format!("sha256:{}", "0".repeat(64));
        assert_eq!(
            norm(&format!("busybox@{digest}")),
            format!("docker.io/library/busybox@{digest}")
        );
        assert_eq!(
            norm(&format!("busybox:1@{digest}")),
            format!("docker.io/library/busybox:1@{digest}")
        );
    }

    #[test]
    fn splits_parts() {
        let reference = Reference::parse("127.0.0.1:5000/team/app:v2").unwrap();
        assert_eq!(reference.registry, "127.0.0.1:5000");
        assert_eq!(reference.repository, "team/app");
        assert_eq!(reference.manifest_ref(), "v2");
        let digest = format!("sha256:{}", "ab".repeat(32));
        let pinned = Reference::parse(&format!("app@{digest}")).unwrap();
        assert_eq!(pinned.tag, None);
        assert_eq!(pinned.manifest_ref(), digest);
        assert_eq!(
            pinned.with_tag("x").unwrap().to_string(),
            "docker.io/library/app:x"
        );
    }

    #[test]
    fn refuses_bad_names() {
        for bad in [
            "",
            "Busybox",
            "busybox:",
            "busybox:-x",
            "busybox@sha256:abc",
            "busybox@md5:00",
            "a//b",
            "a/../b",
            "/busybox",
            "busybox/",
            "bad host:5000/x",
            "host:port/x",
            "x y",
            "a..b",
            "a___b",
            "-a",
        ] {
            assert!(
                matches!(
                    Reference::parse(bad),
                    Err(ImageError::InvalidReference { .. })
                ),
                "{bad:?} was accepted"
            );
        }
        assert!(Reference::parse(&format!("a:{}", "t".repeat(129))).is_err());
    }
}

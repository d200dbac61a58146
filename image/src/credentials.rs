//! [`Credentials`] for a registry, and where operators already have them: Docker's `config.json`
//! (`docker login` writes it) and `HOST=USER:PASSWORD` entries from flags, environment
//! or the TOML file.
//!
//! A `config.json` maps registry keys to one of `{"auth": base64("user:password")}`,
//! `{"username", "password"}` or `{"identitytoken"}` (an OAuth2 refresh token, which the
//! registry client trades for an access token). Keys are normalised to a host
//! (`https://index.docker.io/v1/` is `docker.io`, `https://ghcr.io` is `ghcr.io`), so
//! they match what [`crate::StoreConfig::credentials`] is keyed by. Credential
//! helpers (`credsStore`, `credHelpers`) run external programs and are not used; the
//! caller is told so it can warn.
//!
//! Errors name the file or the entry and what is wrong, never a password or token.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use super::reference::{DOCKER_HUB, DOCKER_HUB_API};

/// Why credentials could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The file could not be read.
    #[error("registry config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a Docker `config.json`, or an entry of it is unusable.
    #[error("registry config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the secret itself).
        message: String,
    },
    /// A `HOST=USER:PASSWORD` entry is malformed.
    #[error("registry auth entry {index} ({what}): {message}")]
    Entry {
        /// 1-based position of the entry in its list.
        index: usize,
        /// Where the list came from (`--registry-auth`, `ORCHARD_REGISTRY_AUTH`, ...).
        what: String,
        /// What is wrong (never the secret itself).
        message: String,
    },
}

/// What a `config.json` holds, as far as pulls go.
#[derive(Debug, Default)]
pub struct DockerConfig {
    /// Credentials per normalised host.
    pub auths: HashMap<String, Credentials>,
    /// Registries configured for credential helpers, which are not run.
    pub helpers: Vec<String>,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    auths: HashMap<String, RawAuth>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: HashMap<String, String>,
}

#[derive(Deserialize, Default)]
struct RawAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// The host a `config.json` key or a `--registry-auth` host names: scheme, path and
/// Docker Hub's aliases stripped (`https://index.docker.io/v1/` is `docker.io`).
pub fn normalize_host(key: &str) -> String {
    let key = key.trim();
    let rest = key.split_once("://").map_or(key, |(_, rest)| rest);
    let host = rest.split('/').next().unwrap_or(rest).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | DOCKER_HUB_API | "registry.hub.docker.com" => DOCKER_HUB.to_string(),
        _ => host,
    }
}

/// Parses the text of a Docker `config.json` read from `path`.
pub fn parse_docker_config(path: &Path, text: &str) -> Result<DockerConfig, CredentialsError> {
    let parse = |message: String| CredentialsError::Parse {
        path: path.to_path_buf(),
        message,
    };
    // serde_json's messages quote no input, only positions and expected types.
    let raw: RawConfig = serde_json::from_str(text)
        .map_err(|err| parse(format!("not a Docker config.json: {err}")))?;
    let mut config = DockerConfig::default();
    for (key, entry) in raw.auths {
        let host = normalize_host(&key);
        if host.is_empty() {
            return Err(parse(format!("auths key {key:?} names no registry")));
        }
        let credentials = if let Some(token) = entry.identitytoken.filter(|t| !t.is_empty()) {
            Credentials {
                username: entry.username.unwrap_or_default(),
                password: String::new(),
                identity_token: Some(token),
            }
        } else if let Some(auth) = entry.auth.filter(|a| !a.is_empty()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| parse(format!("auths.{key:?}.auth is not valid base64")))?;
            let decoded = String::from_utf8(decoded)
                .map_err(|_| parse(format!("auths.{key:?}.auth does not decode to UTF-8")))?;
            let (username, password) = decoded.split_once(':').ok_or_else(|| {
                parse(format!(
                    "auths.{key:?}.auth does not decode to \"user:password\""
                ))
            })?;
            Credentials::basic(username, password)
        } else if let (Some(username), Some(password)) = (entry.username, entry.password) {
            Credentials::basic(username, password)
        } else {
            // `docker login` with a credential store leaves `{}` entries behind.
            continue;
        };
        if credentials.identity_token.is_none() && credentials.username.is_empty() {
            return Err(parse(format!("auths.{key:?} has an empty user name")));
        }
        config.auths.insert(host, credentials);
    }
    if let Some(store) = raw.creds_store.filter(|s| !s.is_empty()) {
        config.helpers.push(format!("credsStore {store}"));
    }
    for (registry, helper) in raw.cred_helpers {
        config
            .helpers
            .push(format!("{registry} (credHelpers {helper})"));
    }
    config.helpers.sort();
    Ok(config)
}

/// Reads and parses the Docker `config.json` at `path`.
pub fn load_docker_config(path: &Path) -> Result<DockerConfig, CredentialsError> {
    let text = std::fs::read_to_string(path).map_err(|source| CredentialsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_docker_config(path, &text)
}

/// Where Docker keeps its config: `$DOCKER_CONFIG/config.json`, else
/// `~/.docker/config.json`; `None` when no such file exists.
pub fn default_docker_config() -> Option<PathBuf> {
    let path = match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("config.json"),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".docker/config.json"),
    };
    path.is_file().then_some(path)
}

/// Parses `HOST=USER:PASSWORD` entries (`what` names their source in errors). The
/// password may contain `:` and `=`; the host is normalised like a `config.json` key.
pub fn parse_auth_entries(
    entries: &[String],
    what: &str,
) -> Result<HashMap<String, Credentials>, CredentialsError> {
    let mut out = HashMap::new();
    for (i, entry) in entries.iter().enumerate() {
        let bad = |message: &str| CredentialsError::Entry {
            index: i + 1,
            what: what.to_string(),
            message: message.to_string(),
        };
        let (host, secret) = entry
            .split_once('=')
            .ok_or_else(|| bad("use HOST=USER:PASSWORD, e.g. ghcr.io=me:ghp_xxx"))?;
        let host = normalize_host(host);
        if host.is_empty() {
            return Err(bad("the host is empty; use HOST=USER:PASSWORD"));
        }
        let (username, password) = secret
            .split_once(':')
            .ok_or_else(|| bad("use HOST=USER:PASSWORD (the ':' is missing)"))?;
        if username.is_empty() {
            return Err(bad("the user name is empty"));
        }
        out.insert(host, Credentials::basic(username, password));
    }
    Ok(out)
}

/// User name and password for a registry (basic auth, or to obtain a token).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password or access token.
    pub password: String,
    /// An OAuth2 refresh token (Docker's `identitytoken`), traded at the token server
    /// for access tokens instead of sending the user name and password.
    pub identity_token: Option<String>,
}

impl Credentials {
    /// A user name and password.
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Credentials {
        Credentials {
            username: username.into(),
            password: password.into(),
            identity_token: None,
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password, not even in debug logs.
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field(
                "identity_token",
                &self.identity_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn docker_config_forms() {
        let text = format!(
            r#"{{"auths": {{
                "https://index.docker.io/v1/": {{"auth": "{}"}},
                "ghcr.io": {{"username": "bob", "password": "p=w:x"}},
                "http://127.0.0.1:5000/v2/": {{"identitytoken": "refresh"}},
                "quay.io": {{}}
            }}, "credsStore": "desktop", "credHelpers": {{"gcr.io": "gcloud"}}}}"#,
            b64("alice:s3cr:et")
        );
        let c = parse_docker_config(Path::new("c.json"), &text).unwrap();
        assert_eq!(c.auths["docker.io"], Credentials::basic("alice", "s3cr:et"));
        assert_eq!(c.auths["ghcr.io"], Credentials::basic("bob", "p=w:x"));
        assert_eq!(
            c.auths["127.0.0.1:5000"].identity_token.as_deref(),
            Some("refresh")
        );
        assert!(!c.auths.contains_key("quay.io"));
        assert_eq!(
            c.helpers,
            ["credsStore desktop", "gcr.io (credHelpers gcloud)"]
        );
    }

    #[test]
    fn bad_files_name_the_file_and_not_the_secret() {
        for text in [
            "not json".to_string(),
            r#"{"auths": {"x.io": {"auth": "%%%secret%%%"}}}"#.to_string(),
            format!(
                r#"{{"auths": {{"x.io": {{"auth": "{}"}}}}}}"#,
                b64("nocolonsecret")
            ),
            r#"{"auths": []}"#.to_string(),
        ] {
            let err = parse_docker_config(Path::new("/etc/x/config.json"), &text).unwrap_err();
            let message = err.to_string();
            assert!(
                message.starts_with("registry config /etc/x/config.json: "),
                "{message}"
            );
            assert!(!message.contains("secret"), "{message}");
        }
    }

    #[test]
    fn auth_entries() {
        let entries = vec![
            "127.0.0.1:5000=u:p:w=x".to_string(),
            "https://index.docker.io/v1/=hub:tok".to_string(),
        ];
        let parsed = parse_auth_entries(&entries, "--registry-auth").unwrap();
        assert_eq!(parsed["127.0.0.1:5000"], Credentials::basic("u", "p:w=x"));
        assert_eq!(parsed["docker.io"], Credentials::basic("hub", "tok"));
        for bad in ["nohost", "=u:p", "h.io=justsecret", "h.io=:secret"] {
            let err = parse_auth_entries(&[bad.to_string()], "ORCHARD_REGISTRY_AUTH").unwrap_err();
            let message = err.to_string();
            assert!(message.contains("ORCHARD_REGISTRY_AUTH"), "{message}");
            assert!(!message.contains("secret"), "{message}");
        }
    }
}

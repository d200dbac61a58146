//! A client of the distribution API v2 (what Docker Hub, GHCR, Quay, Harbor and Debian's
//! `docker-registry` all speak): manifests and blobs, with mirrors and authentication.
//!
//! Endpoints: a reference's registry may have mirrors (`StoreConfig::mirrors`, as in
//! containerd's `hosts.toml` or Docker's `registry-mirrors`); they are tried in order and
//! the upstream last. Docker Hub's upstream is `registry-1.docker.io`. Plain HTTP is used
//! for loopback hosts and registries listed as insecure, HTTPS otherwise; a mirror URL
//! may name its scheme itself.
//!
//! Authentication follows the `WWW-Authenticate` challenge of a 401: for `Bearer`, a
//! token is fetched from the challenge's realm (with the configured credentials as basic
//! auth, or anonymously) and cached per endpoint and scope until it expires; for `Basic`,
//! the configured credentials are sent. Redirects (blob CDNs) are followed; reqwest drops
//! the `Authorization` header when a redirect leaves the host.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{Response, StatusCode};

use super::error::{chain, Cause};
use super::reference::{Reference, DOCKER_HUB, DOCKER_HUB_API};
use super::{Credentials, ImageError, StoreConfig};

/// Time allowed to open a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed between two reads of a response: a stalled download fails instead of
/// hanging a pull forever (there is no overall timeout: layers can be large).
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Token lifetime when the token server does not say (the spec's default).
const DEFAULT_TOKEN_SECONDS: u64 = 60;
/// Largest manifest or error body read into memory.
pub const MAX_DOCUMENT: usize = 8 << 20;
/// The distribution spec's header with a manifest's digest.
const DIGEST_HEADER: &str = "docker-content-digest";

/// One place an image can be fetched from.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Base URL, without a trailing slash or `/v2` (`http://127.0.0.1:5000`).
    pub url: String,
    /// Whether it is a mirror (else the upstream registry).
    pub mirror: bool,
    /// Credentials for it, if configured.
    pub credentials: Option<Credentials>,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.mirror {
            write!(f, "{} (mirror)", self.url)
        } else {
            f.write_str(&self.url)
        }
    }
}

/// The endpoints for `reference`, in the order to try them: mirrors, then upstream.
pub fn endpoints(config: &StoreConfig, reference: &Reference) -> Vec<Endpoint> {
    let registry = reference.registry.as_str();
    let mut out = Vec::new();
    let mirrors = config
        .mirrors
        .iter()
        .filter(|(host, _)| canonical_registry(host) == registry);
    for (_, urls) in mirrors {
        for url in urls {
            let url = url.trim().trim_end_matches('/');
            let url = url.strip_suffix("/v2").unwrap_or(url);
            if url.is_empty() {
                continue;
            }
            let (url, host) = match url.split_once("://") {
                Some((_, rest)) => (
                    url.to_string(),
                    rest.split('/').next().unwrap_or(rest).to_string(),
                ),
                None => {
                    let host = url.split('/').next().unwrap_or(url);
                    (
                        format!("{}://{url}", scheme(config, host)),
                        host.to_string(),
                    )
                }
            };
            out.push(Endpoint {
                url,
                mirror: true,
                credentials: config.credentials.get(&host).cloned(),
            });
        }
    }
    let host = if registry == DOCKER_HUB {
        DOCKER_HUB_API
    } else {
        registry
    };
    let credentials = config
        .credentials
        .iter()
        .find(|(key, _)| canonical_registry(key) == registry)
        .map(|(_, credentials)| credentials.clone());
    out.push(Endpoint {
        url: format!("{}://{host}", scheme(config, registry)),
        mirror: false,
        credentials,
    });
    out
}

/// Docker Hub goes by several names.
fn canonical_registry(host: &str) -> &str {
    match host {
        "index.docker.io" | DOCKER_HUB_API | "registry.hub.docker.com" => DOCKER_HUB,
        other => other,
    }
}

fn scheme(config: &StoreConfig, host: &str) -> &'static str {
    let bare = host_without_port(host);
    let insecure = config
        .insecure_registries
        .iter()
        .any(|listed| listed == host || listed == bare);
    if insecure || is_loopback(bare) {
        "http"
    } else {
        "https"
    }
}

fn host_without_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.split(':').next().unwrap_or(host)
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The outcome of one request to one endpoint, for deciding whether to try the next.
#[derive(Debug)]
pub enum Attempt {
    /// Could not connect, timed out, or the server failed (5xx, 429): try elsewhere.
    Unreachable {
        /// What the endpoint's line of the error says.
        reason: String,
        /// The transport's error, when the request failed there (a 5xx has none).
        source: Option<Cause>,
    },
    /// The endpoint does not have it.
    NotFound(String),
    /// A definite failure (authentication, a malformed answer).
    Failed(ImageError),
}

impl Attempt {
    fn describe(&self) -> String {
        match self {
            Attempt::Unreachable { reason, .. } => reason.clone(),
            Attempt::NotFound(reason) => format!("not found ({reason})"),
            Attempt::Failed(err) => err.to_string(),
        }
    }
}

/// The error for a request that no endpoint answered: unreachable when all of them
/// were, else what the last one that answered said, naming every endpoint tried.
fn combine(reference: &str, what: &str, attempts: Vec<(String, Attempt)>) -> ImageError {
    let tried: Vec<String> = attempts
        .iter()
        .map(|(endpoint, attempt)| format!("{endpoint}: {}", attempt.describe()))
        .collect();
    // `tried` names every endpoint, but a source is one error: the last transport
    // failure, the freshest word on why no endpoint answered (a 5xx or 429 carries
    // none, its words are all there is).
    let last_cause = attempts
        .iter()
        .rev()
        .find_map(|(_, attempt)| match attempt {
            Attempt::Unreachable { source, .. } => source.clone(),
            Attempt::NotFound(_) | Attempt::Failed(_) => None,
        });
    match attempts
        .into_iter()
        .rev()
        .find(|(_, attempt)| !matches!(attempt, Attempt::Unreachable { .. }))
    {
        None | Some((_, Attempt::Unreachable { .. })) => ImageError::Unreachable {
            reference: reference.to_string(),
            tried,
            source: last_cause,
        },
        Some((_, Attempt::NotFound(_))) if what == "manifest" => ImageError::UnknownImage {
            reference: reference.to_string(),
            tried,
        },
        Some((_, Attempt::NotFound(_))) => ImageError::invalid(
            format!("{what} of {reference}"),
            format!("no endpoint has it (tried {})", tried.join("; ")),
        ),
        Some((_, Attempt::Failed(err))) => err,
    }
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// Fetch a token from `realm`.
    Bearer {
        /// Token server URL.
        realm: String,
        /// `service` parameter for the token server.
        service: Option<String>,
        /// `scope` the registry asks for.
        scope: Option<String>,
    },
    /// Send a user name and password.
    Basic,
}

/// Parses a `WWW-Authenticate` value such as
/// `Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull"`.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = HashMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ',')).collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('=') {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect();
        }
        params.insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    Some(Challenge::Bearer {
        realm: params.remove("realm")?,
        service: params.remove("service"),
        scope: params.remove("scope"),
    })
}

#[derive(Debug, Clone)]
enum Auth {
    Bearer(String),
    Basic(Credentials),
}

/// A manifest as fetched.
#[derive(Debug, Clone)]
pub struct FetchedManifest {
    /// The document.
    pub bytes: Vec<u8>,
    /// Its `Content-Type`.
    pub content_type: Option<String>,
    /// The registry's `Docker-Content-Digest`, if sent.
    pub digest_header: Option<String>,
    /// Index of the endpoint that answered.
    pub endpoint: usize,
}

/// The HTTP side of the store: one connection pool and token cache for all pulls.
pub struct RegistryClient {
    http: reqwest::Client,
    targets: std::sync::Arc<super::targets::TargetPolicy>,
    /// Auth to send per endpoint and scope, with its expiry.
    auth: Mutex<HashMap<String, (Auth, Instant)>>,
}

impl RegistryClient {
    /// A client with the store's timeouts.
    pub fn new(targets: super::targets::TargetPolicy) -> Result<RegistryClient, ImageError> {
        let targets = std::sync::Arc::new(targets);
        let on_redirect = targets.clone();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            // Every hop is checked against the policy, not only the first URL.
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 5 {
                    return attempt.error("more than 5 redirects");
                }
                match on_redirect.check_url(attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(reason) => attempt.error(reason),
                }
            }))
            .user_agent(concat!("orchard/", env!("CARGO_PKG_VERSION")));
        if targets.restrict {
            builder = builder.dns_resolver(std::sync::Arc::new(super::targets::GuardedResolver(
                targets.clone(),
            )));
        }
        let http = builder
            .build()
            .map_err(|err| ImageError::invalid_by("HTTP client", chain(&err), err))?;
        Ok(RegistryClient {
            http,
            targets,
            auth: Mutex::new(HashMap::new()),
        })
    }

    /// Refuses a URL the target policy does not allow.
    fn check(&self, url: &str) -> Result<(), Attempt> {
        let parsed = reqwest::Url::parse(url).map_err(|e| {
            Attempt::Failed(ImageError::invalid_by("registry URL", e.to_string(), e))
        })?;
        self.targets
            .check_url(&parsed)
            .map_err(|reason| Attempt::Failed(ImageError::invalid("registry address", reason)))
    }

    /// Fetches the manifest `manifest_ref` (tag or digest) of `reference`'s repository
    /// from the first endpoint that has it.
    pub async fn manifest(
        &self,
        endpoints: &[Endpoint],
        reference: &Reference,
        manifest_ref: &str,
        first: usize,
    ) -> Result<FetchedManifest, ImageError> {
        let path = format!("manifests/{manifest_ref}");
        let mut attempts = Vec::new();
        for index in order(endpoints.len(), first) {
            let endpoint = &endpoints[index];
            let outcome = match self
                .get(
                    endpoint,
                    &reference.repository,
                    &path,
                    Some(super::manifest::MANIFEST_ACCEPT),
                )
                .await
            {
                Ok(response) => {
                    let content_type = header(response.headers(), CONTENT_TYPE.as_str());
                    let digest_header = header(response.headers(), DIGEST_HEADER);
                    match read_limited(response, MAX_DOCUMENT).await {
                        Ok(bytes) => {
                            return Ok(FetchedManifest {
                                bytes,
                                content_type,
                                digest_header,
                                endpoint: index,
                            })
                        }
                        Err(Unread { reason, source }) => Attempt::Unreachable { reason, source },
                    }
                }
                Err(attempt) => attempt,
            };
            attempts.push((endpoint.to_string(), outcome));
        }
        Err(combine(&reference.to_string(), "manifest", attempts))
    }

    /// Starts downloading the blob `digest`, trying endpoint `first` before the others.
    pub async fn blob(
        &self,
        endpoints: &[Endpoint],
        reference: &Reference,
        digest: &str,
        first: usize,
    ) -> Result<Response, ImageError> {
        let path = format!("blobs/{digest}");
        let mut attempts = Vec::new();
        for index in order(endpoints.len(), first) {
            let endpoint = &endpoints[index];
            match self.get(endpoint, &reference.repository, &path, None).await {
                Ok(response) => return Ok(response),
                Err(attempt) => attempts.push((endpoint.to_string(), attempt)),
            }
        }
        Err(combine(
            &reference.to_string(),
            &format!("blob {digest}"),
            attempts,
        ))
    }

    /// A small blob (a config) read whole, at most `limit` bytes.
    pub async fn small_blob(
        &self,
        endpoints: &[Endpoint],
        reference: &Reference,
        digest: &str,
        first: usize,
        limit: usize,
    ) -> Result<Vec<u8>, ImageError> {
        let response = self.blob(endpoints, reference, digest, first).await?;
        read_limited(response, limit)
            .await
            .map_err(|Unread { reason, source }| ImageError::Invalid {
                what: format!("blob {digest} of {reference}"),
                reason,
                source,
            })
    }

    /// One GET, answering a 401 challenge once.
    async fn get(
        &self,
        endpoint: &Endpoint,
        repository: &str,
        path: &str,
        accept: Option<&str>,
    ) -> Result<Response, Attempt> {
        let url = format!("{}/v2/{repository}/{path}", endpoint.url);
        self.check(&url)?;
        let scope = format!("repository:{repository}:pull");
        let key = format!("{} {scope}", endpoint.url);
        let mut auth = self.cached(&key);
        for round in 0..2 {
            let mut request = self.http.get(&url);
            if let Some(accept) = accept {
                request = request.header(ACCEPT, accept);
            }
            request = match &auth {
                Some(Auth::Bearer(token)) => request.bearer_auth(token),
                Some(Auth::Basic(credentials)) => {
                    request.basic_auth(&credentials.username, Some(&credentials.password))
                }
                None => request,
            };
            let response = request.send().await.map_err(|err| Attempt::Unreachable {
                // The message reads the same for every transport failure; the error
                // itself goes on as the source, for the log.
                reason: super::targets::connect_failure(&err),
                source: Some(Arc::new(err)),
            })?;
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            if status == StatusCode::UNAUTHORIZED && round == 0 {
                let challenge = response
                    .headers()
                    .get_all(WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|value| value.to_str().ok())
                    .find_map(parse_challenge);
                let (fresh, lifetime) = self.authenticate(endpoint, challenge, &scope).await?;
                if let Ok(mut cache) = self.auth.lock() {
                    cache.insert(key.clone(), (fresh.clone(), Instant::now() + lifetime));
                }
                auth = Some(fresh);
                continue;
            }
            let message = error_message(response).await;
            return Err(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    if let Ok(mut cache) = self.auth.lock() {
                        cache.remove(&key);
                    }
                    auth_failed(endpoint, format!("{status} for {url}: {message}"))
                }
                StatusCode::NOT_FOUND => Attempt::NotFound(message),
                status if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS => {
                    Attempt::Unreachable {
                        reason: format!("answered {status}: {message}"),
                        source: None,
                    }
                }
                status => Attempt::Failed(ImageError::Registry {
                    endpoint: endpoint.url.clone(),
                    url,
                    status: status.as_u16(),
                    message,
                }),
            });
        }
        Err(auth_failed(
            endpoint,
            "the registry kept asking for authentication".to_string(),
        ))
    }

    fn cached(&self, key: &str) -> Option<Auth> {
        let cache = self.auth.lock().ok()?;
        let (auth, expiry) = cache.get(key)?;
        (Instant::now() < *expiry).then(|| auth.clone())
    }

    /// Answers a challenge: a token from the realm, or the configured basic credentials.
    async fn authenticate(
        &self,
        endpoint: &Endpoint,
        challenge: Option<Challenge>,
        scope: &str,
    ) -> Result<(Auth, Duration), Attempt> {
        let failed = |reason: String| auth_failed(endpoint, reason);
        let (realm, service, challenge_scope) = match challenge {
            Some(Challenge::Basic) => return basic_auth(endpoint),
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => (realm, service, scope),
            None => {
                return Err(failed(
                    "401 without a Bearer or Basic challenge".to_string(),
                ))
            }
        };
        let url = reqwest::Url::parse(&realm).map_err(|err| {
            auth_failed_by(endpoint, format!("bad token realm {realm:?}: {err}"), err)
        })?;
        // A registry names its token server: it must not be a way in either.
        self.targets.check_url(&url).map_err(failed)?;
        let scope = challenge_scope.as_deref().unwrap_or(scope);
        let request = self.token_request(endpoint, url, service.as_deref(), scope)?;
        let response = request.send().await.map_err(|err| Attempt::Unreachable {
            reason: format!(
                "token server {realm}: {}",
                super::targets::connect_failure(&err)
            ),
            source: Some(Arc::new(err)),
        })?;
        read_token(endpoint, &realm, response).await
    }

    /// Authentication's request to the token server: the identity token POSTed, or a
    /// GET with the basic credentials, if any.
    fn token_request(
        &self,
        endpoint: &Endpoint,
        mut url: reqwest::Url,
        service: Option<&str>,
        scope: &str,
    ) -> Result<reqwest::RequestBuilder, Attempt> {
        let refresh_token = endpoint
            .credentials
            .as_ref()
            .and_then(|c| c.identity_token.as_deref());
        Ok(match refresh_token {
            // Docker's identity token is an OAuth2 refresh token: POST it (the token
            // server's OAuth form), never in a URL where logs would keep it.
            Some(refresh_token) => {
                let mut form = reqwest::Url::parse("form:").map_err(|err| {
                    auth_failed_by(
                        endpoint,
                        format!("cannot build the token request: {err}"),
                        err,
                    )
                })?;
                form.query_pairs_mut()
                    .append_pair("grant_type", "refresh_token")
                    .append_pair("service", service.unwrap_or_default())
                    .append_pair("scope", scope)
                    .append_pair("client_id", "orchard")
                    .append_pair("refresh_token", refresh_token);
                self.http
                    .post(url)
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(form.query().unwrap_or_default().to_string())
            }
            None => {
                {
                    let mut query = url.query_pairs_mut();
                    if let Some(service) = service {
                        query.append_pair("service", service);
                    }
                    query.append_pair("scope", scope);
                }
                let mut request = self.http.get(url);
                if let Some(credentials) = &endpoint.credentials {
                    request =
                        request.basic_auth(&credentials.username, Some(&credentials.password));
                }
                request
            }
        })
    }
}

/// The error of a failed authentication at `endpoint`: a refusal, with no error under it.
fn auth_failed(endpoint: &Endpoint, reason: String) -> Attempt {
    Attempt::Failed(ImageError::AuthFailed {
        registry: endpoint.url.clone(),
        reason,
        source: None,
    })
}

/// The error of an authentication at `endpoint` that `source`'s error made fail
/// (`reason` quotes it, as the message always did).
fn auth_failed_by(
    endpoint: &Endpoint,
    reason: String,
    source: impl std::error::Error + Send + Sync + 'static,
) -> Attempt {
    Attempt::Failed(ImageError::AuthFailed {
        registry: endpoint.url.clone(),
        reason,
        source: Some(Arc::new(source)),
    })
}

/// Authentication's answer to a Basic challenge: the configured credentials.
fn basic_auth(endpoint: &Endpoint) -> Result<(Auth, Duration), Attempt> {
    let failed = |reason: String| auth_failed(endpoint, reason);
    match &endpoint.credentials {
            Some(credentials) if credentials.identity_token.is_some() => Err(failed(
                "the registry asks for a user name and password and only an identity token is configured for it".to_string(),
            )),
            // Basic credentials do not expire; re-check them hourly anyway.
            Some(credentials) => Ok((Auth::Basic(credentials.clone()), Duration::from_secs(3600))),
            None => Err(failed(
                "the registry asks for a user name and password and none is configured for it".to_string(),
            )),
        }
}

/// Authentication's last step: the token server's answer read into a token and how
/// long to keep it.
async fn read_token(
    endpoint: &Endpoint,
    realm: &str,
    response: reqwest::Response,
) -> Result<(Auth, Duration), Attempt> {
    let failed = |reason: String| auth_failed(endpoint, reason);
    let status = response.status();
    if !status.is_success() {
        let who = match &endpoint.credentials {
            Some(credentials) if credentials.identity_token.is_some() => {
                "the configured identity token".to_string()
            }
            Some(credentials) => format!("the credentials of {}", credentials.username),
            None => "anonymous access (no credentials configured)".to_string(),
        };
        let message = error_message(response).await;
        return Err(failed(format!(
            "token server {realm} refused {who}: {status}: {message}"
        )));
    }
    let body =
        read_limited(response, MAX_DOCUMENT)
            .await
            .map_err(|Unread { reason, source }| Attempt::Unreachable {
                reason: format!("token server {realm}: {reason}"),
                source,
            })?;
    #[derive(serde::Deserialize)]
    struct TokenAnswer {
        token: Option<String>,
        access_token: Option<String>,
        expires_in: Option<u64>,
    }
    let answer: TokenAnswer = serde_json::from_slice(&body).map_err(|err| {
        auth_failed_by(
            endpoint,
            format!("token server {realm} answered malformed JSON: {err}"),
            err,
        )
    })?;
    let token = answer
        .token
        .or(answer.access_token)
        .filter(|token| !token.is_empty())
        .ok_or_else(|| failed(format!("token server {realm} answered no token")))?;
    // Renew a little early so a token does not expire between check and use.
    let seconds = answer
        .expires_in
        .unwrap_or(DEFAULT_TOKEN_SECONDS)
        .saturating_sub(5)
        .max(1);
    Ok((Auth::Bearer(token), Duration::from_secs(seconds)))
}

/// Endpoint indexes starting with `first`.
fn order(count: usize, first: usize) -> impl Iterator<Item = usize> {
    let first = if first < count { first } else { 0 };
    std::iter::once(first)
        .chain((0..count).filter(move |i| *i != first))
        .take(count)
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Why a body could not be read whole: what to say, and the transport's error when
/// the connection failed (none for a body over the limit).
struct Unread {
    reason: String,
    source: Option<Cause>,
}

impl Unread {
    fn too_large(limit: usize) -> Unread {
        Unread {
            reason: format!("the answer is larger than {limit} bytes"),
            source: None,
        }
    }
}

/// Reads a whole body of at most `limit` bytes.
async fn read_limited(mut response: Response, limit: usize) -> Result<Vec<u8>, Unread> {
    if response
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return Err(Unread::too_large(limit));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|err| Unread {
        reason: chain(&err),
        source: Some(Arc::new(err)),
    })? {
        if body.len() + chunk.len() > limit {
            return Err(Unread::too_large(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The message of a registry error body (`{"errors":[{"code":..,"message":..}]}`), or
/// the start of whatever else it sent.
async fn error_message(response: Response) -> String {
    let status = response.status();
    let Ok(body) = read_limited(response, 64 << 10).await else {
        return status.to_string();
    };
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<ErrorItem>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorItem {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    if let Ok(errors) = serde_json::from_slice::<Errors>(&body) {
        let text: Vec<String> = errors
            .errors
            .iter()
            .map(|e| format!("{} {}", e.code, e.message).trim().to_string())
            .collect();
        if !text.is_empty() {
            return text.join("; ");
        }
    }
    // Anything else is not echoed: the body of whatever answered is not ours to show
    // (a pull must not read arbitrary pages out to a client).
    status.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endpoint that did not answer, saying `reason`, with no error under it.
    fn no_answer(reason: &str) -> Attempt {
        Attempt::Unreachable {
            reason: reason.into(),
            source: None,
        }
    }

    #[test]
    fn parses_challenges() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/busybox:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"bearer realm=http://127.0.0.1:9/t, service="a \"b\"""#),
            Some(Challenge::Bearer {
                realm: "http://127.0.0.1:9/t".into(),
                service: Some("a \"b\"".into()),
                scope: None,
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="registry""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(parse_challenge(""), None);
    }

    #[test]
    fn mirrors_come_first_and_schemes_follow_the_config() {
        let mut config = StoreConfig::default();
        config.mirrors.insert(
            "docker.io".into(),
            vec![
                "http://127.0.0.1:5000/".into(),
                "mirror.example.com/v2".into(),
                "localhost:7000".into(),
            ],
        );
        config.insecure_registries.push("registry.lan:5000".into());
        config
            .credentials
            .insert("docker.io".into(), Credentials::basic("u", "p"));
        let hub = Reference::parse("python:3.11-slim").unwrap();
        let urls: Vec<String> = endpoints(&config, &hub)
            .iter()
            .map(|e| e.url.clone())
            .collect();
        assert_eq!(
            urls,
            [
                "http://127.0.0.1:5000",
                "https://mirror.example.com",
                "http://localhost:7000",
                "https://registry-1.docker.io"
            ]
        );
        let all = endpoints(&config, &hub);
        assert!(all[..3].iter().all(|e| e.mirror) && !all[3].mirror);
        assert!(all[3].credentials.is_some() && all[0].credentials.is_none());
        let lan = Reference::parse("registry.lan:5000/x").unwrap();
        assert_eq!(endpoints(&config, &lan)[0].url, "http://registry.lan:5000");
        let remote = Reference::parse("ghcr.io/x/y").unwrap();
        assert_eq!(endpoints(&config, &remote)[0].url, "https://ghcr.io");
        let local = Reference::parse("127.0.0.1:5000/x").unwrap();
        assert_eq!(endpoints(&config, &local)[0].url, "http://127.0.0.1:5000");
    }

    #[test]
    fn combining_failures() {
        let unreachable = combine(
            "r",
            "manifest",
            vec![
                ("a".into(), no_answer("refused")),
                ("b".into(), no_answer("dns")),
            ],
        );
        match unreachable {
            ImageError::Unreachable { tried, .. } => assert_eq!(tried, ["a: refused", "b: dns"]),
            other => panic!("{other:?}"),
        }
        let unknown = combine(
            "r",
            "manifest",
            vec![
                ("a".into(), Attempt::NotFound("manifest unknown".into())),
                ("b".into(), no_answer("x")),
            ],
        );
        assert!(matches!(unknown, ImageError::UnknownImage { tried, .. } if tried.len() == 2));
        let order: Vec<usize> = order(3, 1).collect();
        assert_eq!(order, [1, 0, 2]);
        assert_eq!(super::order(2, 7).collect::<Vec<_>>(), [0, 1]);
    }

    /// Of several endpoints that failed at the transport, the source is the error of
    /// the one given up on last; the message names them all, as it always did.
    #[test]
    fn combining_keeps_the_last_transport_error_as_the_source() {
        let failed = |reason: &str, cause: &str| Attempt::Unreachable {
            reason: reason.into(),
            source: Some(Arc::new(std::io::Error::other(cause.to_string()))),
        };
        let e = combine(
            "r",
            "manifest",
            vec![
                ("a".into(), failed("refused", "first")),
                ("b".into(), failed("timed out", "second")),
                ("c".into(), no_answer("answered 503 Service Unavailable: x")),
            ],
        );
        assert_eq!(
            e.to_string(),
            "registry unreachable for r: tried a: refused; b: timed out; \
             c: answered 503 Service Unavailable: x"
        );
        let cause = e.cause().and_then(|c| c.downcast_ref::<std::io::Error>());
        assert_eq!(cause.map(ToString::to_string).as_deref(), Some("second"));
        assert!(std::error::Error::source(&e).is_some());
    }

    /// A registry nobody answers at: the message reads as it always did (the same
    /// for every transport failure), and reqwest's error is kept under it.
    #[tokio::test]
    async fn a_refused_connection_keeps_reqwest_error_as_the_source() {
        let client = RegistryClient::new(super::super::targets::TargetPolicy::default()).unwrap();
        let endpoint = Endpoint {
            url: "http://127.0.0.1:1".into(),
            mirror: false,
            credentials: None,
        };
        let reference = Reference::parse("127.0.0.1:1/x").unwrap();
        let e = client
            .manifest(&[endpoint], &reference, "latest", 0)
            .await
            .unwrap_err();
        assert!(matches!(e, ImageError::Unreachable { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "registry unreachable for 127.0.0.1:1/x:latest: tried http://127.0.0.1:1: \
             could not connect, or no answer in time"
        );
        let cause = e.cause().and_then(|c| c.downcast_ref::<reqwest::Error>());
        assert!(cause.is_some_and(reqwest::Error::is_connect), "{e:?}");
    }

    /// A token realm that is no URL fails authentication in the words it always did,
    /// with the URL parser's error as the source.
    #[tokio::test]
    async fn a_bad_token_realm_keeps_the_parse_error_as_the_source() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
                request.push(byte[0]);
            }
            conn.write_all(
                b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"no url\"\r\n\
                  Content-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .unwrap();
        });
        let client = RegistryClient::new(super::super::targets::TargetPolicy::default()).unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let endpoint = Endpoint {
            url: url.clone(),
            mirror: false,
            credentials: None,
        };
        let reference = Reference::parse(&format!("127.0.0.1:{port}/x")).unwrap();
        let e = client
            .manifest(&[endpoint], &reference, "latest", 0)
            .await
            .unwrap_err();
        server.join().unwrap();
        let parse_error = reqwest::Url::parse("no url").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("authentication to {url} failed: bad token realm \"no url\": {parse_error}")
        );
        // `url::ParseError`, which reqwest does not name: downcast to the type of one.
        fn as_type_of<'a, T: std::error::Error + 'static>(
            cause: &'a (dyn std::error::Error + Send + Sync + 'static),
            _like: &T,
        ) -> Option<&'a T> {
            cause.downcast_ref::<T>()
        }
        let cause = e.cause().and_then(|c| as_type_of(c, &parse_error));
        assert_eq!(cause, Some(&parse_error), "{e:?}");
    }
}

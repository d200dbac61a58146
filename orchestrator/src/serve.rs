//! `orchard serve`: opens the image store under the data directory and the configured
//! backend (local, or Kubernetes), adopts what a previous process left, serves the API until SIGTERM or
//! SIGINT, then deletes the sandboxes (unless told to keep them for a restart).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

#[cfg(feature = "kubernetes")]
use crate::backend::kubernetes::KubeBackend;
use crate::backend::local::{LocalBackend, LocalConfig};
use crate::backend::Backend;
use crate::config::{BackendChoice, Config, StateChoice};
use crate::image::gc::{self, InUse};
use crate::image::{ImageStore, StoreConfig};
use crate::metrics::Metrics;
use crate::server::{router, AppState};
use crate::service::{Keys, Service};
#[cfg(feature = "redis")]
use crate::state::redis::RedisStore;

/// Why the server could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Setup failed.
    #[error("{0}")]
    Setup(String),
    /// Serving failed.
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
}

/// The key file under the data directory: the generated key, kept across restarts.
fn generated_key(data_dir: &Path) -> Result<String, ServeError> {
    generated_key_from(data_dir, getrandom::fill)
}

/// [`generated_key`] with the random source as a parameter. When `fill` fails, no key
/// is made or written: the server refuses to start rather than guard its API with a
/// key of predictable bytes.
fn generated_key_from(
    data_dir: &Path,
    fill: impl FnOnce(&mut [u8]) -> Result<(), getrandom::Error>,
) -> Result<String, ServeError> {
    let path = data_dir.join("api-key");
    if let Ok(k) = std::fs::read_to_string(&path) {
        let k = k.trim().to_string();
        if !k.is_empty() {
            return Ok(k);
        }
    }
    let random = crate::random::hex_from(24, fill)
        .map_err(|e| ServeError::Setup(format!("generating an API key: {e}")))?;
    let key = format!("ork_{random}");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| ServeError::Setup(format!("writing {}: {e}", path.display())))?;
    writeln!(f, "{key}")
        .map_err(|e| ServeError::Setup(format!("writing {}: {e}", path.display())))?;
    Ok(key)
}

/// Builds the service and the router on `backend` (tests pass their own backend).
pub async fn app(
    backend: Arc<dyn Backend>,
    images: ImageStore,
    config: &Config,
    keys: Keys,
) -> Result<(axum::Router, Service), ServeError> {
    let service_config = config.service.clone();
    let metrics = Arc::new(Metrics::default());
    let service = match &config.state {
        StateChoice::Memory => Service::open(backend, images, service_config, metrics).await,
        #[cfg(not(feature = "redis"))]
        StateChoice::Redis { url, .. } => {
            return Err(not_compiled(format!("state {url:?}"), "redis", "`memory`"))
        }
        #[cfg(feature = "redis")]
        StateChoice::Redis { url, prefix } => {
            let store = RedisStore::connect(url, prefix)
                .await
                .map_err(|e| ServeError::Setup(format!("opening the state store: {e}")))?;
            tracing::info!(prefix = %prefix, "state in redis");
            Service::open_with_store(backend, Arc::new(store), images, service_config, metrics)
                .await
        }
    }
    .map_err(|e| ServeError::Setup(format!("starting the service: {e}")))?;
    let spools = crate::service::files::spool::Spools::new(
        &config.service.data_dir,
        config.upload_spool,
        config.connections.body_timeout,
    );
    let state = AppState {
        service: service.clone(),
        keys: Arc::new(keys),
        spools: Arc::new(spools),
        reads: Arc::new(crate::server::job_body::ReadShares::start()),
    };
    Ok((router(state), service))
}

/// A configuration built by hand (not by [`Config::resolve`], which refuses it first)
/// chose a part this build left out.
#[cfg(not(all(feature = "kubernetes", feature = "redis")))]
fn not_compiled(setting: String, feature: &'static str, instead: &'static str) -> ServeError {
    let err = crate::config::ConfigError::NotCompiled {
        setting,
        feature,
        instead,
    };
    ServeError::Setup(err.to_string())
}

/// Opens the image store of `config`.
pub fn open_images(config: &Config) -> Result<ImageStore, ServeError> {
    let mut store_config = StoreConfig::default();
    for (registry, url) in &config.registry_mirrors {
        store_config
            .mirrors
            .entry(registry.clone())
            .or_default()
            .push(url.clone());
    }
    store_config.credentials = config.registry.credentials.clone();
    // Pulls name their registry; loopback and link-local ones only when the operator
    // allowed them, or configured them as mirrors.
    let mut allowed = config.allow_registries.clone();
    for (_, url) in &config.registry_mirrors {
        if let Ok(u) = reqwest::Url::parse(url) {
            if let Some(h) = u.host_str() {
                allowed.push(h.trim_start_matches('[').trim_end_matches(']').to_string());
            }
        } else {
            allowed.push(url.split('/').next().unwrap_or(url).to_string());
        }
    }
    store_config.targets = crate::image::targets::TargetPolicy {
        restrict: true,
        allowed,
        egress: config.egress.clone(),
    };
    ImageStore::open(config.service.data_dir.join("images"), store_config)
        .map_err(|e| ServeError::Setup(format!("opening the image store: {e}")))
}

/// Logs where registry credentials come from (hosts only, never a secret) and starts
/// the image GC task: a pass after every pull or import and every interval, keeping
/// the images of the service's sandboxes and every layer a mounted overlay uses.
pub fn start_image_gc(config: &Config, service: &Service) {
    let registry = &config.registry;
    if !registry.credentials.is_empty() {
        let mut hosts: Vec<&str> = registry.credentials.keys().map(String::as_str).collect();
        hosts.sort();
        tracing::info!(hosts = %hosts.join(","), from = %registry.credential_sources.join(", "), "registry credentials loaded");
    }
    if !registry.ignored_helpers.is_empty() {
        tracing::warn!(helpers = %registry.ignored_helpers.join(", "), "credential helpers are not run; configure those registries with --registry-auth");
    }
    let Some(policy) = registry.gc else {
        return;
    };
    let store = service.images().clone();
    let root = store.root().to_path_buf();
    let users = service.clone();
    // Called on a blocking thread of the runtime (the pass runs in `spawn_blocking`).
    // Snapshots keep their image's layers: forks mount them long after the sandbox
    // that ran the image is gone.
    let in_use = move || {
        let handle = tokio::runtime::Handle::current();
        let snapshots = handle
            .block_on(users.backend().snapshots())
            .unwrap_or_default();
        let mut references: Vec<String> = handle
            .block_on(users.all())
            .unwrap_or_default()
            .iter()
            .map(|r| r.image.clone())
            .collect();
        references.extend(snapshots.iter().map(|s| s.image.clone()));
        let mut layers = gc::mounted_layers(&root);
        layers.extend(snapshots.into_iter().flat_map(|s| s.image_layers));
        InUse { references, layers }
    };
    let metrics = service.metrics().clone();
    let report = move |outcome: &gc::BudgetReport| {
        let m = &metrics.image_gc;
        m.store_bytes.set(outcome.bytes_after);
        let removed = &outcome.removed;
        m.bytes_total.inc_by(removed.bytes_freed);
        m.images_total.inc_by(removed.images_removed.len() as u64);
        m.layers_total.inc_by(removed.layers_removed as u64);
        if removed.layers_removed + removed.blobs_removed + removed.images_removed.len() > 0 {
            tracing::info!(images_removed = %removed.images_removed.join(","), layers_removed = %removed.layers_removed, bytes_freed = %removed.bytes_freed, store_bytes = %outcome.bytes_after, "image gc");
        }
        if let Some(budget) = outcome.budget.filter(|b| outcome.bytes_after > *b) {
            tracing::warn!(store_bytes = %outcome.bytes_after, budget_bytes = %budget, "image store over its disk budget; what is left is in use");
        }
    };
    tracing::info!(budget = %policy.budget, interval_s = %policy.interval.as_secs(), "image gc");
    tokio::spawn(gc::run(store, policy, in_use, report));
}

/// Opens the configured backend.
async fn open_backend(config: &Config) -> Result<Arc<dyn Backend>, ServeError> {
    match &config.backend {
        BackendChoice::Local => {
            if !config.agent.is_file() {
                return Err(ServeError::Setup(format!(
                    "the agent binary {} does not exist: build it with `make agent` or pass --agent",
                    config.agent.display()
                )));
            }
            let mut local =
                LocalConfig::new(config.service.data_dir.join("backend"), &config.agent);
            local.harness = config.harness.clone();
            local.disk = config.sandbox_disk;
            local.allow_user_namespaces = config.allow_user_namespaces;
            local.egress = config.egress.clone();
            local.ready_timeout = config.service.policy.max_ready_timeout;
            // Replicas over one Redis serve the same sandboxes: each may run on this
            // data directory beside the others (one exclusive backend per root otherwise).
            local.shared = matches!(config.state, StateChoice::Redis { .. });
            let backend = LocalBackend::open(local)
                .map_err(|e| ServeError::Setup(format!("opening the local backend: {e}")))?;
            Ok(Arc::new(backend))
        }
        #[cfg(not(feature = "kubernetes"))]
        BackendChoice::Kubernetes(_) => Err(not_compiled(
            "backend \"kubernetes\"".into(),
            "kubernetes",
            "local",
        )),
        #[cfg(feature = "kubernetes")]
        BackendChoice::Kubernetes(kube) => {
            let mut kube = (**kube).clone();
            kube.egress = config.egress.clone();
            // Warm pods have the default limits: a create that asks for nothing claims one.
            kube.warm_cpus = crate::units::parse_cpu(&config.service.defaults.cpu).ok();
            kube.warm_memory_bytes =
                crate::units::parse_memory(&config.service.defaults.memory).ok();
            // --sandbox-disk bounds a sandbox's writes on either backend.
            if kube.ephemeral_storage.is_none() {
                kube.ephemeral_storage = config.sandbox_disk.map(|d| d.bytes.to_string());
            }
            let backend = KubeBackend::connect(kube.clone())
                .await
                .map_err(|e| ServeError::Setup(format!("starting the Kubernetes backend: {e}")))?;
            tracing::info!(namespace = %kube.namespace, injector_image = %kube.injector_image, "kubernetes backend");
            Ok(Arc::new(backend))
        }
    }
}

/// Descriptors a server with many sandboxes wants: each live sandbox holds a few (its
/// agent connections, its lock while busy), each client connection one.
const WANTED_OPEN_FILES: u64 = 65_536;

/// Raises the soft open-file limit to the hard one (the soft default, often 1024, runs
/// out at a few hundred sandboxes with clients), and says so when even the hard limit
/// is below [`WANTED_OPEN_FILES`]: the operator must raise it (`LimitNOFILE=` in a
/// systemd unit, `ulimit -Hn` in a shell; see docs/scale.md).
fn raise_open_files() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(error = %e, "could not raise the open-file limit");
        }
    }
    let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    if now < WANTED_OPEN_FILES {
        tracing::warn!(
            open_files = now,
            wanted = WANTED_OPEN_FILES,
            "the open-file limit is low for many sandboxes: about 8 descriptors per sandbox plus one per client connection; raise the hard limit (docs/scale.md)"
        );
    }
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn serve(config: Config) -> Result<(), ServeError> {
    crate::log::set_level(&config.log_level);
    raise_open_files();
    let data_dir = &config.service.data_dir;
    std::fs::create_dir_all(data_dir)
        .map_err(|e| ServeError::Setup(format!("creating {}: {e}", data_dir.display())))?;
    // It holds the generated key, every tenant's jobs and the sandboxes' tokens.
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| ServeError::Setup(format!("securing {}: {e}", data_dir.display())))?;
    let keys = if config.no_auth {
        tracing::warn!("auth is disabled: every request is accepted");
        Keys::disabled()
    } else if config.api_keys.is_empty() {
        let key = generated_key(data_dir)?;
        eprintln!(
            "orchard: no API key configured; use this one (saved in {}):\n  export SANDBOX_API_KEY={key}",
            data_dir.join("api-key").display()
        );
        Keys::new([key])
    } else {
        let keys = Keys::new(&config.api_keys);
        if config.operator_keys.is_empty() {
            if config.api_keys.len() > 1 {
                tracing::warn!(
                    "several keys and no --operator-key: no key may import or delete images"
                );
            }
            keys
        } else {
            keys.with_operators(&config.operator_keys)
        }
    };
    let images = open_images(&config)?;
    // Its creates, deletes and snapshots run off the request thread (see `offload`).
    let backend: Arc<dyn Backend> = Arc::new(
        crate::backend::offload::Offload::new(open_backend(&config).await?)
            .map_err(|e| ServeError::Setup(format!("starting the backend's threads: {e}")))?,
    );
    let (router, service) = app(backend, images, &config, keys).await?;
    start_image_gc(&config, &service);
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| ServeError::Setup(format!("listening on {}: {e}", config.listen)))?;
    let addr = listener.local_addr()?;
    let url = format!("http://{addr}");
    tracing::info!(url = %url, data_dir = %data_dir.display(), "listening");
    if let Some(f) = &config.ready_file {
        std::fs::write(f, format!("{url}\n"))
            .map_err(|e| ServeError::Setup(format!("writing {}: {e}", f.display())))?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    crate::server::listen::serve(listener, router, config.connections.clone(), shutdown).await;
    if config.keep_sandboxes_on_exit {
        tracing::info!("stopping; sandboxes are kept for the next start");
        if let Err(e) = service.backend().release().await {
            tracing::warn!(error = %e, "releasing the backend");
        }
    } else {
        tracing::info!("stopping; deleting every sandbox");
        service.shutdown().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_generated_api_key_is_not_used_when_getrandom_fails() {
        let dir = tempfile::tempdir().unwrap();
        // The source wrote some bytes, then failed: the old helper hex-encoded the
        // buffer whatever getrandom answered.
        let failed = generated_key_from(dir.path(), |buf| {
            buf.fill(7);
            Err(getrandom::Error::UNEXPECTED)
        });
        let err = failed.expect_err("a key from a failed generator");
        assert!(err.to_string().contains("generating an API key"), "{err}");
        assert!(!dir.path().join("api-key").exists(), "nothing is written");

        let key = generated_key_from(dir.path(), |buf| {
            buf.fill(0xab);
            Ok(())
        })
        .unwrap();
        assert_eq!(key, format!("ork_{}", "ab".repeat(24)));
        let kept = generated_key_from(dir.path(), |_| Err(getrandom::Error::UNEXPECTED));
        assert_eq!(
            kept.unwrap(),
            key,
            "a saved key is read back, not regenerated"
        );
    }
}

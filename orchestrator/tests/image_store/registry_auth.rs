//! Pulls from a real private registry (`docker-registry` with a bcrypt `htpasswd`
//! file): refused without credentials, accepted with those of a Docker `config.json`,
//! also when the registry is a mirror of Docker Hub; refusals never show the password.

use std::path::Path;

use base64::Engine as _;
use orchard::image::credentials;
use orchard::image::{ImageError, StoreConfig};

use super::{new_store, no_progress};
use crate::util::registry::{auth_registry, registry, Proxy, ProxyAuth, AUTH_PASSWORD, AUTH_USER};

/// A Docker `config.json` for the private registry, written under `dir`.
pub fn docker_config(dir: &Path, host: &str, password: &str) -> std::path::PathBuf {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{AUTH_USER}:{password}"));
    let path = dir.join("config.json");
    let json = serde_json::json!({"auths": {format!("http://{host}/v2/"): {"auth": auth}}});
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

#[tokio::test]
async fn a_private_registry_needs_the_credentials_of_a_docker_config() {
    let private = auth_registry();
    private.push_image("busybox", "latest", "private/busybox:latest");
    let reference = format!("{}/private/busybox:latest", private.host);

    let (_dir, store) = new_store(StoreConfig::default());
    let denied = store.pull(&reference, no_progress).await.unwrap_err();
    assert!(matches!(denied, ImageError::AuthFailed { .. }), "{denied}");
    assert!(
        denied.to_string().contains("none is configured"),
        "{denied}"
    );

    let files = tempfile::tempdir().unwrap();
    let wrong = credentials::load_docker_config(&docker_config(
        files.path(),
        &private.host,
        "wrong-password",
    ))
    .unwrap();
    let (_dir, store) = new_store(StoreConfig {
        credentials: wrong.auths,
        ..StoreConfig::default()
    });
    let refused = store.pull(&reference, no_progress).await.unwrap_err();
    assert!(
        matches!(refused, ImageError::AuthFailed { .. }),
        "{refused}"
    );
    assert!(!refused.to_string().contains("wrong-password"), "{refused}");
    assert!(
        !format!("{refused:?}").contains("wrong-password"),
        "{refused:?}"
    );

    let right =
        credentials::load_docker_config(&docker_config(files.path(), &private.host, AUTH_PASSWORD))
            .unwrap();
    assert!(!format!("{:?}", right.auths).contains(AUTH_PASSWORD));
    let (_dir, store) = new_store(StoreConfig {
        credentials: right.auths.clone(),
        ..StoreConfig::default()
    });
    let image = store.pull(&reference, no_progress).await.unwrap();
    assert!(image.layers[0].join("bin/busybox").is_file());

    // The same registry as a Docker Hub mirror: credentials are looked up by the
    // mirror's host.
    private.push_image("busybox", "latest", "library/busybox:latest");
    let mut config = StoreConfig {
        credentials: right.auths,
        ..StoreConfig::default()
    };
    config
        .mirrors
        .insert("docker.io".into(), vec![private.url()]);
    let (_dir, store) = new_store(config);
    let image = store.pull("busybox", no_progress).await.unwrap();
    assert_eq!(image.reference, "docker.io/library/busybox:latest");
}

#[tokio::test]
async fn an_identity_token_is_traded_for_access_tokens_and_never_sent_in_a_url() {
    registry().push_image("whiteout", "latest", "whiteout:latest");
    let proxy = Proxy::start(&registry().host, ProxyAuth::Refresh("refresh-me".into())).await;
    let files = tempfile::tempdir().unwrap();
    let path = files.path().join("config.json");
    let json = serde_json::json!({"auths": {proxy.host.clone(): {"identitytoken": "refresh-me"}}});
    std::fs::write(&path, json.to_string()).unwrap();
    let config = credentials::load_docker_config(&path).unwrap();
    let (_dir, store) = new_store(StoreConfig {
        credentials: config.auths,
        ..StoreConfig::default()
    });
    let reference = format!("{}/whiteout:latest", proxy.host);
    store.pull(&reference, no_progress).await.unwrap();
    let seen = proxy.seen();
    let tokens: Vec<_> = seen
        .iter()
        .filter(|s| s.path.starts_with("/token"))
        .collect();
    assert!(!tokens.is_empty() && tokens.iter().all(|s| s.method == "POST" && s.status == 200));
    assert!(
        seen.iter().all(|s| !s.path.contains("refresh-me")),
        "{seen:?}"
    );

    // A wrong identity token is refused, and the refusal does not show it.
    let (_dir, store) = new_store(StoreConfig {
        credentials: [(
            proxy.host.clone(),
            orchard::image::Credentials {
                identity_token: Some("stale-token".into()),
                ..orchard::image::Credentials::basic("", "")
            },
        )]
        .into(),
        ..StoreConfig::default()
    });
    let err = store.pull(&reference, no_progress).await.unwrap_err();
    assert!(matches!(err, ImageError::AuthFailed { .. }), "{err}");
    assert!(
        err.to_string().contains("identity token") && !err.to_string().contains("stale-token"),
        "{err}"
    );
}

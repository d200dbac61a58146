//! Issue 31 on every kind of image (python, busybox, and one with no files at all):
//! PID 1's environment is readable and holds the image's environment and no token, and
//! the sandbox's writes stop at its disk bound. Through the agent's files API, which
//! works where the image has no shell.

use std::time::Duration;

use orchard::image::{ImageStore, StoreConfig};

use crate::util::sandbox::*;
use crate::util::server::image_layout;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid_1s_environ_and_the_disk_bound_hold_on_python_busybox_and_an_empty_image() {
    orchard_test_support::require_runc!();
    let tb = backend_with_disk(24 << 20, 4096, 1);
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path().join("store"), StoreConfig::default()).unwrap();
    for (layout, name) in [
        ("python", "python:3.11-slim"),
        ("busybox", "busybox:latest"),
        ("empty", "empty:latest"),
    ] {
        store.import(&image_layout(layout), Some(name)).unwrap();
        let image = store.get(name).unwrap().unwrap();
        let sb = tb.create(spec_of(image, layout)).await;
        let client = sb.client();

        let environ = client.read_file("/proc/1/environ").await.unwrap();
        let environ = String::from_utf8_lossy(&environ).into_owned();
        let vars: Vec<&str> = environ.split('\0').filter(|v| !v.is_empty()).collect();
        assert!(
            vars.iter().any(|v| v.starts_with("PATH=/")),
            "{layout}: {vars:?}"
        );
        assert!(
            !vars.iter().any(|v| v.starts_with("ORCHARD_AGENT_")) && !environ.contains(&sb.token),
            "{layout}: a secret in PID 1's environ"
        );

        // 8 MiB at a time: the agent takes bodies of at most 16 MiB.
        let chunk = vec![7u8; 8 << 20];
        let mut refused = None;
        for i in 0..4 {
            if let Err(e) = client
                .write_file(&format!("/fill{i}"), chunk.clone(), None)
                .await
            {
                refused = Some((i, e.to_string()));
                break;
            }
        }
        let (i, why) = refused.unwrap_or_else(|| panic!("{layout}: 32 MiB fit a 24 MiB disk"));
        assert!(i >= 1, "{layout}: the first 8 MiB were refused: {why}");
        assert!(
            why.contains("space") || why.contains("ENOSPC") || why.contains("28"),
            "{layout}: {why}"
        );
        // Freed space is usable again.
        client.remove("/fill0", false).await.unwrap();
        client
            .write_file("/after", b"fine".to_vec(), None)
            .await
            .unwrap();
    }
    let _ = tb.backend.wait_disk_pool(Duration::from_secs(60));
    tb.finish().await;
}

//! PID 1 as programs expect it (issue 31): `/proc/1/environ` holds the image's
//! environment and no token, so what `kubectl exec` and Orchard's "reachable from
//! kubectl exec" check do (start from an empty environment, take PATH from PID 1) finds
//! the harness tools.

use std::fs;

use crate::util::sandbox::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_is_found_through_the_images_path_in_pid_1s_environ() {
    orchard_test_support::require_runc!();
    let (tb, harness) = backend_with_hello_harness();
    let (_dir, sb) = python_sandbox(&tb, "pid1env").await;

    // Read in an empty environment by the sandbox's root, as `kubectl exec` would.
    let r = exec(&sb, argv(&["env", "-i", "/bin/cat", "/proc/1/environ"])).await;
    assert_eq!(r.exit_code, Some(0), "/proc/1/environ unreadable: {r:?}");
    let environ = r.stdout.text_lossy();
    let vars: Vec<&str> = environ.split('\0').filter(|v| !v.is_empty()).collect();
    let get = |k: &str| {
        vars.iter()
            .find_map(|v| v.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in /proc/1/environ: {vars:?}"))
    };
    // The image's PATH with the harness appended, HOME, and the image's own ENV.
    assert!(get("PATH").contains("/usr/local/bin:"), "{vars:?}");
    assert!(get("PATH").ends_with(":/opt/sandbox-tools/bin"), "{vars:?}");
    assert_eq!(get("HOME"), "/root");
    assert!(get("PYTHON_VERSION").starts_with("3.11"), "{vars:?}");
    assert!(
        !vars.iter().any(|v| v.starts_with("ORCHARD_AGENT_")),
        "{vars:?}"
    );
    assert!(
        !environ.contains(&sb.token),
        "the token is in PID 1's environ"
    );

    // Orchard's check: nothing but PID 1's PATH, then the tool by name.
    let found = sh_ok(
        &sb,
        "env -i /bin/sh -c 'export $(tr \"\\0\" \"\\n\" < /proc/1/environ | grep ^PATH=); \
         command -v hello; hello'",
    )
    .await;
    assert_eq!(found, "/usr/local/bin/hello\nhello from the harness\n");
    tb.finish().await;
    fs::remove_dir_all(&harness).unwrap();
}

//! The `orchard-injector` binary as an init container runs it: exit status and messages.

use std::path::Path;
use std::process::{Command, Output};

fn injector(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_orchard-injector"))
        .args(args)
        .output()
        .expect("running orchard-injector")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn injects_then_verifies_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("volume");
    let t = target.to_str().unwrap();
    let out = injector(&["--agent", "/bin/busybox", "--target", t]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("injected 1 files"), "{}", text(&out));
    assert!(target.join("bin/orchard-agent").is_file());
    assert!(target.join("manifest.json").is_file());
    let out = injector(&["--verify", "--target", t]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("verified 1 files"), "{}", text(&out));
}

#[test]
fn a_missing_agent_or_harness_exits_non_zero_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("volume");
    let t = t.to_str().unwrap();
    let out = injector(&["--agent", "/no/such/agent", "--target", t]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("the agent binary /no/such/agent does not exist"),
        "{}",
        text(&out)
    );
    let out = injector(&[
        "--agent",
        "/bin/busybox",
        "--harness",
        "/no/such/bundle",
        "--target",
        t,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("/no/such/bundle"), "{}", text(&out));
    let out = injector(&["--target", t]);
    assert!(!out.status.success(), "{}", text(&out));
}

#[test]
fn verify_fails_on_a_tampered_volume() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("volume");
    let t = target.to_str().unwrap();
    assert!(injector(&["--agent", "/bin/busybox", "--target", t])
        .status
        .success());
    std::fs::write(Path::new(t).join("bin/orchard-agent"), b"oops").unwrap();
    let out = injector(&["--verify", "--target", t]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("mismatch"), "{}", text(&out));
}

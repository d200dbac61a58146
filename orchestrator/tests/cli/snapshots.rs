//! `orchard sandbox pause|resume|snapshot` and `orchard snapshot ls|get|rm|fork` against
//! a real server.

use serde_json::Value;

use super::{run, Server};

#[test]
fn sandboxes_are_paused_snapshotted_and_forked_from_the_command_line() {
    orchard_test_support::require_runc!();
    let server = Server::start();
    server.import_busybox();
    let id = server.sandbox();
    let out = run(server.cli(&["sandbox", "exec", &id, "--sh", "echo", "t1", ">", "/turn"]));
    assert_eq!(out.code, 0, "{out:?}");

    let out = run(server.cli(&["sandbox", "pause", &id]));
    assert_eq!(
        (out.code, out.stdout.trim()),
        (0, format!("{id} paused").as_str()),
        "{out:?}"
    );
    let out = run(server.cli(&["sandbox", "exec", &id, "true"]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("paused"), "{out:?}");
    let out = run(server.cli(&["sandbox", "resume", &id]));
    assert_eq!(
        (out.code, out.stdout.trim()),
        (0, format!("{id} running").as_str()),
        "{out:?}"
    );

    let out = run(server.cli(&["sandbox", "snapshot", &id, "--label", "turn=1"]));
    assert_eq!(out.code, 0, "{out:?}");
    let sid = out.stdout.trim().to_string();
    assert!(sid.starts_with("snap-"), "{out:?}");
    let out = run(server.cli(&["snapshot", "ls"]));
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.starts_with("SNAPSHOT"), "{out:?}");
    assert!(
        out.stdout.contains(&sid) && out.stdout.contains(&id),
        "{out:?}"
    );
    let out = run(server.cli(&["snapshot", "get", &sid]));
    let snap: Value = serde_json::from_str(&out.stdout).expect("get prints JSON");
    assert_eq!(snap["labels"]["turn"], "1", "{snap}");

    let out = run(server.cli(&["snapshot", "fork", &sid, "-k", "2"]));
    assert_eq!(out.code, 0, "{out:?}");
    let forks: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(forks.len(), 2, "{out:?}");
    for f in &forks {
        let out = run(server.cli(&["sandbox", "exec", f, "cat", "/turn"]));
        assert_eq!((out.code, out.stdout.as_str()), (0, "t1\n"), "{out:?}");
    }
    // In use: refused, exit 1, the forks named.
    let out = run(server.cli(&["snapshot", "rm", &sid]));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains(forks[0]), "{out:?}");
    let mut rm = vec!["sandbox", "rm", id.as_str()];
    rm.extend(forks.iter().copied());
    assert_eq!(run(server.cli(&rm)).code, 0);
    let out = run(server.cli(&["snapshot", "rm", &sid]));
    assert_eq!((out.code, out.stdout.trim()), (0, sid.as_str()), "{out:?}");
}

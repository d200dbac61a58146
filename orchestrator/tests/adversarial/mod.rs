//! Attacks from inside a sandbox, each written as the attack it stops (issue 12's
//! hardening). Code in a sandbox is written by models under training: it probes the
//! kernel for whatever it can reach.

mod reads_as_user;

use crate::util::sandbox::{python_sandbox, sh, TestBackend};
use crate::util::server::{image_layout, temp_dir};

/// Calls each system call with arguments that are harmless when it is allowed (null
/// pointers, an unknown command) and prints `name errno`: EPERM (1) or ENOSYS (38) only
/// come from the filter; an allowed call fails with EFAULT, EINVAL or EBADF instead.
const PROBE: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
calls = {
    "add_key": (248, 0, 0, 0, 0, 0),
    "request_key": (249, 0, 0, 0, 0),
    "keyctl": (250, 0, -4, 0),
    "bpf": (321, 0, 0, 0),
    "perf_event_open": (298, 0, 0, -1, -1, 0),
    "io_uring_setup": (425, 1, 0),
    "userfaultfd": (323, 0),
    "unshare_newuser": (272, 0x10000000),
    "clone3": (435, 0, 0),
    "setns": (308, -1, 0),
    "open_by_handle_at": (304, -1, 0, 0),
    "fsopen": (430, 0, 0),
    "socket_af_packet": (41, 17, 3, 0),
}
for name, (nr, *args) in calls.items():
    ctypes.set_errno(0)
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    print(name, r, ctypes.get_errno())
"#;

/// Runs a python `probe` in `sb`; answers its output (it must exit 0).
async fn run_probe(sb: &orchard::backend::local::SandboxInfo, probe: &str) -> String {
    let r = sh(sb, &format!("python3 -c '{probe}'")).await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    r.stdout.text_lossy()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_sandbox_code_cannot_reach_keyrings_bpf_io_uring_or_user_namespaces() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let (_dir, sb) = python_sandbox(&tb, "adv").await;
    let out = run_probe(&sb, PROBE).await;
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (name, ret, errno) = (f[0], f[1], f[2]);
        let expected = if name == "clone3" { "38" } else { "1" };
        assert_eq!(
            (ret, errno),
            ("-1", expected),
            "{name} must be refused by the filter: {out}"
        );
    }
    assert_eq!(out.lines().count(), 13, "{out}");
    // The tool an attacker would use: `unshare -U -r -m` then mount a tmpfs.
    let r = sh(
        &sb,
        "unshare -U -r -m sh -c 'mount -t tmpfs none /mnt && echo MOUNTED'",
    )
    .await;
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    assert!(!r.stdout.text_lossy().contains("MOUNTED"));
    tb.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_workloads_still_run_under_the_filter() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let (_dir, sb) = python_sandbox(&tb, "adv").await;
    // Threads, processes (fork/clone without new namespaces), pip, git, a venv.
    let r = sh(
        &sb,
        "set -e; cd /tmp
python3 - <<'PY'
import concurrent.futures, multiprocessing, subprocess, threading
with multiprocessing.Pool(2) as p:
    assert p.map(abs, [-1, -2]) == [1, 2]
with concurrent.futures.ThreadPoolExecutor(4) as ex:
    assert list(ex.map(abs, [-3])) == [3]
assert subprocess.run(['true']).returncode == 0
print('python ok')
PY
pip --version >/dev/null && echo pip ok
git init -q repo && cd repo && echo hi > f && git add f \
  && git -c user.email=a@b -c user.name=a commit -qm one && git log --oneline | wc -l
python3 -m venv --without-pip /tmp/venv && /tmp/venv/bin/python -c 'print(\"venv ok\")'",
    )
    .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(
        r.stdout.text_lossy(),
        "python ok\npip ok\n1\nvenv ok\n",
        "{r:?}"
    );
    tb.finish().await;
}

/// Finds the agent (the child of PID 1 named `orchard-agent`; PID 1 is its init), then
/// steals its listening socket (fd 3) with pidfd_getfd, reads its first environment
/// (where the token was), ptraces it, and tries to plant a socket or a symlink where
/// the backend connects: each must fail. Last, takes fd 3 of PID 1: the init holds no
/// descriptor of the agent's.
const CHANNEL_PROBE: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def stat(pid):
    try:
        s = open("/proc/%s/stat" % pid).read()
    except OSError:
        return None
    return s[s.index("(") + 1:s.rindex(")")], int(s[s.rindex(")") + 2:].split()[1])
agents = [int(p) for p in os.listdir("/proc") if p.isdigit() and stat(p) == ("orchard-agent", 1)]
assert len(agents) == 1, agents
agent = agents[0]
def getfd(pid):
    try:
        pidfd = os.pidfd_open(pid)
        ctypes.set_errno(0)
        r = libc.syscall(438, pidfd, 3, 0)
        return r, ctypes.get_errno()
    except OSError as e:
        return -1, e.errno
print("pidfd_getfd", *getfd(agent))
try:
    open("/proc/%d/environ" % agent, "rb").read()
    print("environ", 0, 0)
except OSError as e:
    print("environ", -1, e.errno)
ctypes.set_errno(0)
print("ptrace", libc.ptrace(16, agent, 0, 0), ctypes.get_errno())
for p in ["/.orchard/run/agent.sock", "/.orchard/agent.sock"]:
    try:
        os.symlink("/tmp/x", p)
        print("symlink", 0, 0)
    except OSError as e:
        print("symlink", -1, e.errno)
print("sockets", len([1 for d, _, fs in os.walk("/.orchard") for f in fs if os.path.exists(os.path.join(d, f)) and __import__("stat").S_ISSOCK(os.lstat(os.path.join(d, f)).st_mode)]), 0)
print("init_fd3", *getfd(1))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_sandbox_code_cannot_replace_steal_or_redirect_its_agent() {
    orchard_test_support::require_runc!();
    let tb = TestBackend::new();
    let (_dir, sb) = python_sandbox(&tb, "adv").await;
    let out = run_probe(&sb, CHANNEL_PROBE).await;
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 7, "{out}");
    for l in &lines[..5] {
        assert_eq!(l[1], "-1", "{} must fail: {out}", l[0]);
    }
    // EPERM for the descriptor theft and ptrace, EACCES for the agent's environ (it is
    // not dumpable); EROFS (30) for the plants.
    assert_eq!(lines[0][2], "1", "{out}");
    assert_eq!(lines[1][2], "13", "EACCES: {out}");
    assert_eq!(lines[2][2], "1", "EPERM: {out}");
    assert_eq!((lines[3][2], lines[4][2]), ("30", "30"), "{out}");
    assert_eq!(
        lines[5],
        ["sockets", "0", "0"],
        "no socket in the sandbox: {out}"
    );
    // PID 1 (the init) may be inspected, but has nothing to take: EBADF.
    assert_eq!(lines[6], ["init_fd3", "-1", "9"], "{out}");
    // The agent still answers the backend, through the socket it was handed.
    assert_eq!(sh(&sb, "echo alive").await.stdout.text_lossy(), "alive\n");
    tb.finish().await;
}

/// Peak resident memory of a process, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_huge_files_through_the_compatible_routes_stream_with_bounded_memory() {
    orchard_test_support::require_runc!();
    use crate::util::server::{busybox_server, exec_waited, sandbox, KEY};
    use futures_util::StreamExt;
    let (_data, srv) = busybox_server("orchard-dl-", &[]).await;
    let http = reqwest::Client::new();
    let id = "dl";
    sandbox(&http, &srv.url, KEY, id).await;
    // 512 MiB that take no disk: the attack that took the server to 3.6 GB.
    let size: u64 = 512 << 20;
    let truncate = format!("truncate -s {size} /tmp/sparse");
    let (_, job) = exec_waited(&http, &srv.url, KEY, id, &truncate).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let before = peak_rss(srv.child.id());
    let resp = http
        .get(format!("{}/sandboxes/{id}/files?path=/tmp/sparse", srv.url))
        .header("X-API-Key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Read as a stream, keeping only the ends: the client must not hold it either.
    let (mut total, mut head, mut tail) = (0usize, Vec::new(), Vec::new());
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        total += chunk.len();
        if head.len() < 64 {
            head.extend_from_slice(&chunk[..chunk.len().min(64)]);
        }
        tail.extend_from_slice(&chunk);
        let keep = tail.len().saturating_sub(64);
        tail.drain(..keep);
    }
    let head = String::from_utf8(head).unwrap();
    let tail = String::from_utf8(tail).unwrap();
    assert!(
        head.starts_with(r#"{"path":"/tmp/sparse","content":"AAAA"#),
        "{head}"
    );
    assert!(tail.ends_with(&format!(r#"","size":{size}}}"#)), "{tail}");
    let base64_len = (size as usize).div_ceil(3) * 4;
    assert!(total > base64_len && total < base64_len + 100, "{total}");
    let grew = peak_rss(srv.child.id()).saturating_sub(before);
    assert!(
        grew < 128 << 20,
        "the server's peak memory grew by {} MiB for a {} MiB file",
        grew >> 20,
        size >> 20
    );

    // The other way: 256 MiB uploaded as one JSON body, generated as it is sent.
    let up: u64 = 256 << 20;
    let groups = up / 3;
    let chunk = bytes::Bytes::from("AAAA".repeat(16 << 10));
    let per_chunk = 16u64 << 10;
    let chunks = groups / per_chunk;
    let stream = futures_util::stream::iter(
        std::iter::once(bytes::Bytes::from(r#"{"path": "/tmp/up", "content": ""#))
            .chain(std::iter::repeat_n(chunk, chunks as usize))
            .chain(std::iter::once(bytes::Bytes::from(r#""}"#)))
            .map(Ok::<_, std::io::Error>),
    );
    let before = peak_rss(srv.child.id());
    let resp: serde_json::Value = http
        .post(format!("{}/sandboxes/{id}/files", srv.url))
        .header("X-API-Key", KEY)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let expected = chunks * per_chunk * 3;
    assert_eq!(resp["size"], expected, "{resp}");
    let grew = peak_rss(srv.child.id()).saturating_sub(before);
    assert!(
        grew < 128 << 20,
        "the server's peak memory grew by {} MiB for a {} MiB upload",
        grew >> 20,
        expected >> 20
    );
    let (_, job) = exec_waited(&http, &srv.url, KEY, id, "wc -c < /tmp/up").await;
    assert_eq!(job["stdout"], format!("{expected}\n"), "{job}");
    drop(srv);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_sandbox_filling_its_disk_or_inodes_hits_enospc_and_nothing_outside() {
    orchard_test_support::require_runc!();
    use crate::util::sandbox::{fresh_root, test_config};
    use orchard::backend::local::disk::DiskLimit;
    let mut config = test_config(&fresh_root());
    config.disk = Some(DiskLimit {
        bytes: 64 << 20,
        inodes: 4096,
    });
    let tb = TestBackend::with_config(config);
    let sb = tb.busybox().await;
    // 200 MiB into a 64 MiB writable layer: cut short with ENOSPC.
    let r = sh(
        &sb,
        "dd if=/dev/zero of=/big bs=1M count=200 2>&1; ls -l /big",
    )
    .await;
    let out = r.stdout.text_lossy();
    assert!(out.contains("No space left on device"), "{out}");
    let written: u64 = out
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(written <= 64 << 20, "{written}");
    // The host holds no more than the image's size for it.
    let image = sb.bundle.join("disk.img");
    let meta = std::fs::metadata(&image).unwrap();
    let on_host = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
    assert!(on_host <= 64 << 20, "{on_host} bytes on the host disk");
    // An inode flood stops at the image's inode count.
    let r = sh(
        &sb,
        "rm /big; mkdir /flood; i=0; while touch /flood/f$i 2>/dev/null; do i=$((i+1)); done; echo $i",
    )
    .await;
    let made: u64 = r.stdout.text_lossy().trim().parse().unwrap();
    assert!((3000..4096).contains(&made), "{made} files made: {r:?}");
    // The agent keeps serving a full sandbox, and room comes back when files go.
    let r = sh(&sb, "rm -r /flood && echo ok > /after && cat /after").await;
    assert_eq!(r.stdout.text_lossy(), "ok\n", "{r:?}");
    tb.finish().await;
    // Teardown left no loop device on the image.
    let loops = std::process::Command::new("losetup")
        .arg("-j")
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        loops.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&loops.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_second_tenant_cannot_replace_or_delete_the_images_others_run() {
    orchard_test_support::require_runc!();
    use crate::util::server::{send, TestServer, KEY, OTHER_KEY};
    let srv = TestServer::start().await;
    let layout = image_layout("busybox");
    let mut tar = tar::Builder::new(Vec::new());
    tar.append_dir_all(".", &layout).unwrap();
    let archive = tar.into_inner().unwrap();
    let import = |key: &'static str| {
        srv.http
            .post(format!("{}/v1/images/import?name=busybox:latest", srv.url))
            .header("X-API-Key", key)
            .body(archive.clone())
    };
    // The attack: another key overwrites the tag the first key's sandboxes run. Refused
    // before its body is read, the connection cannot carry another request: the client
    // is told to close it, or reqwest may send the next call on it as the server closes
    // it (a flake: IncompleteMessage on the DELETE below).
    let (s, e) = send(import(OTHER_KEY).header("connection", "close")).await;
    assert_eq!(s, 403, "{e}");
    assert!(e["detail"].as_str().unwrap().contains("operator"), "{e}");
    let (s, e) = send(
        srv.http
            .delete(format!("{}/v1/images?reference=busybox:latest", srv.url))
            .header("X-API-Key", OTHER_KEY),
    )
    .await;
    assert_eq!(s, 403, "{e}");
    // Reading and using them stays open to every key; the operator key may change them.
    let (s, _) = srv.get_as(OTHER_KEY, "/v1/images").await;
    assert_eq!(s, 200);
    let (s, v) = send(import(KEY)).await;
    assert_eq!(s, 200, "{v}");
    srv.finish().await;
}

/// A one-route HTTP server on loopback answering every request with `status`,
/// `headers` and `body`; answers its address.
async fn answer_with(
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: &'static str,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(move || {
        let headers = headers.clone();
        async move {
            let mut resp = axum::response::Response::new(axum::body::Body::from(body));
            *resp.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
            for (k, v) in headers {
                resp.headers_mut()
                    .insert(k, axum::http::HeaderValue::from_str(&v).unwrap());
            }
            resp
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_pull_cannot_make_the_server_fetch_loopback_or_echo_what_answered() {
    orchard_test_support::require_runc!();
    use crate::util::server::{pull, ServerProcess, KEY};
    // What an attacker wants read out: a page on the server's own loopback.
    let secret = answer_with(200, vec![], "SECRET-PAGE").await;
    // A "registry" the operator allowed by name, which redirects to it.
    let redirector = answer_with(
        302,
        vec![("location", format!("http://{secret}/secret"))],
        "",
    )
    .await;
    let data = temp_dir("orchard-ssrf-");
    let allowed = format!("localhost:{}", redirector.port());
    let srv = ServerProcess::start_with_env(
        data.path(),
        &[KEY],
        &[("ORCHARD_ALLOW_REGISTRIES", allowed.as_str())],
        &[],
    );
    // Straight at a loopback address, at the link-local metadata address, and (issue
    // 30, point 8) at private ones: refused before any connection.
    for reference in [
        format!("{secret}/x/y:1"),
        "169.254.169.254/latest/meta:1".to_string(),
        "10.255.255.1:5000/x/y:1".to_string(),
        "192.168.77.1/x/y:1".to_string(),
        "[fd00::1]:5000/x/y:1".to_string(),
    ] {
        let last = pull(&srv.url, &reference).await;
        assert_eq!(last["type"], "error", "{reference}: {last}");
        let detail = last["detail"].as_str().unwrap();
        assert!(detail.contains("loopback or link-local"), "{detail}");
        assert!(!detail.contains("SECRET"), "{detail}");
    }
    // Through an allowed registry's redirect: refused at the hop, nothing echoed.
    let last = pull(&srv.url, &format!("localhost:{}/x/y:1", redirector.port())).await;
    assert_eq!(last["type"], "error", "{last}");
    let detail = last["detail"].as_str().unwrap();
    assert!(!detail.contains("SECRET"), "{detail}");
    assert!(detail.contains("loopback or link-local"), "{detail}");
    drop(srv);
}

/// In an image with a `User`, code in the sandbox plants links to root's directories in
/// places it owns and waits for the client to write "its" files there: the root agent
/// must not follow them (it changes files as the image's user), and what it does
/// create belongs to that user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_files_api_does_not_follow_links_the_image_user_planted() {
    orchard_test_support::require_runc!();
    use crate::util::sandbox::{image, layers, sh_ok, spec_of};
    let tb = TestBackend::new();
    let l = layers();
    let config = orchard::image::ImageConfig {
        user: Some("app".into()),
        ..orchard::image::ImageConfig::default()
    };
    let sb = tb
        .create(spec_of(
            image("app", vec![l.busybox.clone(), l.top.clone()], config),
            "links",
        ))
        .await;
    assert_eq!(sh_ok(&sb, "id -u").await, "1000\n");
    // /workspace, root's in the image, was handed to the user.
    assert_eq!(
        sh_ok(&sb, "stat -c %u /workspace; pwd").await,
        "1000\n/workspace\n"
    );
    sh_ok(&sb, "ln -s /etc /tmp/link; ln -s /etc/motd /tmp/motd-link").await;
    let agent = sb.client();

    // Writes, directories, moves, removals and archives through the link are refused
    // with the user's permission error, and /etc is untouched.
    let e = agent
        .write_file("/tmp/link/evil", bytes::Bytes::from_static(b"x"), None)
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Some(orchard_protocol::ErrorCode::PermissionDenied),
        "{e}"
    );
    assert!(agent.mkdir("/tmp/link/evil.d").await.is_err());
    assert!(agent
        .rename("/tmp/link/motd", "/tmp/stolen", false)
        .await
        .is_err());
    assert!(agent.remove("/tmp/link/motd", false).await.is_err());
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(1);
    header.set_mode(0o644);
    tar.append_data(&mut header, "evil", &b"x"[..]).unwrap();
    assert!(agent
        .upload_tar("/tmp/link", tar.into_inner().unwrap())
        .await
        .is_err());
    assert_eq!(
        sh_ok(&sb, "ls /etc | grep -c evil; cat /etc/motd").await,
        "0\ntop\n"
    );

    // Where the user may write, the agent writes, and the files are the user's.
    agent
        .write_file(
            "/workspace/a/b.txt",
            bytes::Bytes::from_static(b"mine"),
            None,
        )
        .await
        .unwrap();
    agent.mkdir("/workspace/d").await.unwrap();
    assert_eq!(
        sh_ok(
            &sb,
            "stat -c %u:%g /workspace/a /workspace/a/b.txt /workspace/d"
        )
        .await,
        "1000:1000\n1000:1000\n1000:1000\n"
    );
    // The link itself (the user's own file) may be replaced by a write: the target
    // is not written through.
    agent
        .write_file("/tmp/motd-link", bytes::Bytes::from_static(b"new"), None)
        .await
        .unwrap();
    assert_eq!(sh_ok(&sb, "cat /etc/motd").await, "top\n");
    tb.finish().await;
}

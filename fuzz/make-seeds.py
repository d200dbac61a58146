#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/seeds/<target>/ (committed).

Run again after changing it; the seeds are small on purpose (each target's whole seed
directory stays under a few tens of KB). A zstd layer seed is made with the `zstd` CLI
when it is installed.
"""

import gzip
import io
import json
import os
import shutil
import subprocess
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, "seeds")


def write(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def tar(entries, fmt=tarfile.GNU_FORMAT):
    """entries: (name, kind, payload, mode) with kind file|dir|sym|hard|chr|fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, kind, payload, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            info.mtime = 1_600_000_000
            if kind == "file":
                data = payload.encode() if isinstance(payload, str) else payload
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
                continue
            if kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, payload
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, payload
            elif kind == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 0, 0
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            t.addfile(info)
    return trim(buf.getvalue())


def trim(data):
    """Drops the record padding after the two zero blocks that end an archive."""
    end = len(data.rstrip(b"\0"))
    end = (end + 511) // 512 * 512
    return data[: end + 1024]


def gz(data):
    return gzip.compress(data, mtime=0)


def tar_seeds():
    t = "tar_extract"
    write(t, "plain", tar([("a.txt", "file", "hello\n", 0o644), ("d/", "dir", None, 0o755),
                           ("d/b.txt", "file", "b\n", 0o600)]))
    write(t, "gzip", gz(tar([("x/y/z.txt", "file", "z\n", 0o644)])))
    write(t, "dotdot", tar([("../escape.txt", "file", "x", 0o644)]))
    write(t, "absolute", tar([("/tmp/abs.txt", "file", "x", 0o644)]))
    write(t, "through-planted-link", tar([("link-out/pwned", "file", "x", 0o644)]))
    write(t, "through-archived-link", tar([("l", "sym", "..", 0o777), ("l/pwned", "file", "x", 0o644)]))
    write(t, "hardlink-out", tar([("h", "hard", "../outside-file", 0o644)]))
    write(t, "hardlink-in", tar([("a", "file", "a", 0o644), ("b", "hard", "a", 0o644)]))
    write(t, "setuid", tar([("suid", "file", "#!/bin/sh\n", 0o4755), ("sdir/", "dir", None, 0o2775)]))
    write(t, "replace-dir-with-file", tar([("dir", "file", "x", 0o644)]))
    write(t, "replace-link", tar([("link-file", "file", "x", 0o644)]))
    write(t, "fifo", tar([("p", "fifo", None, 0o644)]))
    write(t, "pax-long-name", tar([("n" * 150 + "/f", "file", "x", 0o644)], tarfile.PAX_FORMAT))
    write(t, "dir-mode-0", tar([("locked/", "dir", None, 0o000), ("locked/f", "file", "x", 0o644)]))


def git_seeds():
    t = "git_apply"
    a = "".join(f"a line {i}\n" for i in range(1, 21))
    modify = (
        "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n"
        "@@ -2,3 +2,3 @@\n a line 2\n-a line 3\n+a line three\n a line 4\n"
    )
    write(t, "modify", b"\x00" + modify.encode())
    write(t, "modify-check", b"\x01" + modify.encode())
    shifted = modify.replace("@@ -2,3 +2,3 @@", "@@ -9,3 +9,3 @@")
    write(t, "modify-fuzzy", b"\x02" + shifted.encode())
    write(t, "conflict", b"\x00" + modify.replace("a line 4", "a line 99").encode())
    new = "diff --git a/new.txt b/new.txt\nnew file mode 100644\nindex 0000000..ce01362\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hello\n"
    write(t, "new-file", b"\x00" + new.encode())
    write(t, "new-through-link", b"\x00" + new.replace("new.txt", "out/pwned").encode())
    write(t, "new-through-abs-link", b"\x00" + new.replace("new.txt", "abs/pwned").encode())
    write(t, "new-dotdot", b"\x00" + new.replace("new.txt", "../outside/pwned").encode())
    write(t, "new-in-git-dir", b"\x00" + new.replace("new.txt", ".git/hooks/post-commit").encode())
    modify_link = (
        "diff --git a/secret-link b/secret-link\n--- a/secret-link\n+++ b/secret-link\n"
        "@@ -1 +1 @@\n-outside\n+changed\n"
    )
    write(t, "modify-through-link", b"\x00" + modify_link.encode())
    delete = "diff --git a/dir/deep/c.txt b/dir/deep/c.txt\ndeleted file mode 100644\nindex f2ad6c7..0000000\n--- a/dir/deep/c.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-c\n"
    write(t, "delete", b"\x00" + delete.encode())
    rename = "diff --git a/run.sh b/renamed.sh\nsimilarity index 100%\nrename from run.sh\nrename to renamed.sh\n"
    write(t, "rename", b"\x00" + rename.encode())
    write(t, "rename-out", b"\x00" + rename.replace("renamed.sh", "out/renamed.sh").encode())
    mode = "diff --git a/a.txt b/a.txt\nold mode 100644\nnew mode 100755\n"
    write(t, "mode", b"\x00" + mode.encode())
    write(t, "mode-unknown", b"\x00" + new.replace("100644", "120644").encode())
    spaces = "diff --git a/a file with spaces.txt b/a file with spaces.txt\n--- a/a file with spaces.txt\n+++ b/a file with spaces.txt\n@@ -1 +1 @@\n-spaces\n+more spaces\n"
    write(t, "spaces", b"\x00" + spaces.encode())
    empty_new = "diff --git a/empty2 b/empty2\nnew file mode 100644\nindex 0000000..e69de29\n"
    write(t, "empty-new", b"\x00" + empty_new.encode())
    binary = "diff --git a/bin.dat b/bin.dat\nindex 1b2a1b0..4f5a0c1 100644\nGIT binary patch\nliteral 3\nKcmZQzWMT#Y01f~L\n\nliteral 6\nNcmZQzWMXDwU;qFB00961\n\n"
    write(t, "binary", b"\x00" + binary.encode())
    symlink = "diff --git a/newlink b/newlink\nnew file mode 120000\nindex 0000000..1b2a1b0\n--- /dev/null\n+++ b/newlink\n@@ -0,0 +1 @@\n+../outside\n\\ No newline at end of file\n"
    write(t, "new-symlink", b"\x00" + symlink.encode())
    two = modify + new
    write(t, "two-files", b"\x02" + two.encode())
    _ = a


def digest(n):
    return "sha256:" + format(n, "064x")


def manifest_seeds():
    t = "image_manifest"
    m = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(1), "size": 10},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(2), "size": 20}],
    }
    write(t, "oci-manifest", "\n" + json.dumps(m))
    dm = dict(m, mediaType="application/vnd.docker.distribution.manifest.v2+json")
    dm["layers"] = [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": digest(3), "size": 5,
                     "urls": ["http://x"]}]
    write(t, "docker-manifest", "application/vnd.docker.distribution.manifest.v2+json\n" + json.dumps(dm))
    idx = {
        "schemaVersion": 2,
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(4), "size": 1,
             "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(5), "size": 1,
             "platform": {"architecture": "amd64", "os": "linux"},
             "annotations": {"org.opencontainers.image.ref.name": "latest"}},
        ],
    }
    write(t, "oci-index", "application/vnd.oci.image.index.v1+json; charset=utf-8\n" + json.dumps(idx))
    write(t, "schema1", "\n" + json.dumps({"schemaVersion": 1, "name": "x", "fsLayers": []}))
    cfg = {"architecture": "amd64", "os": "linux",
           "config": {"Env": ["PATH=/usr/bin"], "WorkingDir": "/w", "User": "1000:1000",
                      "Entrypoint": ["/bin/sh"], "Cmd": ["-c", "true"]},
           "rootfs": {"type": "layers", "diff_ids": [digest(6)]}}
    write(t, "config", "\x01\n" + json.dumps(cfg))
    write(t, "reference", "python:3.11-slim")
    write(t, "reference-digest", "localhost:5000/a/b-c__d.e:tag@" + digest(7))
    write(t, "reference-hub", "index.docker.io/library/busybox")
    write(t, "challenge", 'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull"')
    write(t, "challenge-basic", 'Basic realm="x"')


def layer_seeds():
    t = "image_layer"
    base = tar([("etc/", "dir", None, 0o755), ("etc/os-release", "file", "ID=test\n", 0o644),
                ("bin/", "dir", None, 0o755), ("bin/sh", "sym", "busybox", 0o777),
                ("bin/busybox", "file", "\x7fELF", 0o4755), ("bin/ls", "hard", "bin/busybox", 0o755)])
    write(t, "plain", base)
    write(t, "gzip", gz(base))
    write(t, "whiteouts", tar([("etc/", "dir", None, 0o755), ("etc/.wh.os-release", "file", "", 0o644),
                               ("opt/", "dir", None, 0o755), ("opt/.wh..wh..opq", "file", "", 0o644)]))
    write(t, "dotdot", tar([("../escape", "file", "x", 0o644)]))
    write(t, "through-link", tar([("l", "sym", "/", 0o777), ("l/tmp/pwned", "file", "x", 0o644)]))
    write(t, "through-relative-link", tar([("l", "sym", "../outside", 0o777), ("l/pwned", "file", "x", 0o644)]))
    write(t, "hardlink-out", tar([("h", "hard", "../outside/secret", 0o644)]))
    write(t, "device", tar([("dev/", "dir", None, 0o755), ("dev/null", "chr", None, 0o666)]))
    pax = io.BytesIO()
    with tarfile.open(fileobj=pax, mode="w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("f")
        info.size = 1
        info.pax_headers = {"SCHILY.xattr.trusted.overlay.redirect": "/etc",
                            "SCHILY.xattr.user.x": "y"}
        tf.addfile(info, io.BytesIO(b"x"))
    write(t, "overlay-xattr", trim(pax.getvalue()))
    if shutil.which("zstd"):
        z = subprocess.run(["zstd", "-q", "-c"], input=base, capture_output=True, check=True).stdout
        write(t, "zstd", z)


def request_seeds():
    t = "request_body"
    bodies = {
        "exec-argv": {"command": ["echo", "hi"], "cwd": "/", "env": {"A": "1"}, "timeout_ms": 1000},
        "exec-shell": {"command": "echo hi", "stdin_b64": "aGk=", "max_output_bytes": 10, "timeout_exit_124": True},
        "signal": {"signal": "TERM"},
        "stdin": {"data": "aGk=", "eof": True},
        "session-run": {"command": "cd /tmp", "timeout_ms": 5},
        "pty-create": {"command": ["bash"], "rows": 24, "cols": 80, "env": {"TERM": "xterm"}},
        "pty-resize": {"rows": 10, "cols": 20},
        "mkdir": {"path": "/a/b", "mode": 493},
        "move": {"from": "/a", "to": "/b", "overwrite": True},
        "git-apply": {"repo": "/w", "patch": "diff --git a/x b/x\n", "check_only": True, "fuzzy": True},
        "git-commit": {"repo": "/w", "message": "m", "author_name": "a", "author_email": "a@b"},
        "git-reset": {"repo": "/w", "target": "HEAD", "clean_untracked": True},
        "git-diff": {"repo": "/w", "base": "HEAD~1", "include_untracked": True, "binary": True},
        "pull": {"reference": "busybox"},
        "v1-create": {"image": "busybox", "id": "sb-1", "cpu": "500m", "memory": "64Mi", "ttl_s": 60,
                      "labels": {"a": "b"}, "wait": False},
        "compat-create": {"image": "python:3.11-slim", "cpu": "2", "memory": "1.5Gi", "timeout": 30},
        "compat-exec": {"command": ["ls", "-la"], "timeout_seconds": 2.5, "env": {"X": "y"}, "wait": True},
        "apply-patch": {"patch": "--- a\n+++ b\n", "timeout_seconds": 5},
        "upload": {"path": "/w/a.txt", "content": "aGk="},
    }
    for name, body in bodies.items():
        write(t, name, json.dumps(body))
    write(t, "quantity", "16Gi")
    write(t, "array", '["busybox"]')


def upload_seeds():
    t = "upload_body"
    write(t, "simple", b"\x07" + json.dumps({"path": "/w/a.txt", "content": "aGVsbG8gd29ybGQ="}).encode())
    write(t, "escaped", b"\x02" + rb' {"extra": {"a": [1, "x\"}"]}, "content": "aGk\/aGVsbG8=", "n": 5, "path": "/w/a \u00e9.txt"} ')
    write(t, "missing", b"\x03" + b'{"content": "aGk="}')
    write(t, "mistyped", b"\x03" + b'{"path": 5, "content": "aGk="}')
    write(t, "not-object", b"\x03" + b'["a"]')
    write(t, "padding-mid", b"\x03" + b'{"path": "p", "content": "aGk=aGk="}')


def pty_seeds():
    t = "pty_frame"
    frames = {
        "init": {"type": "init", "cmd": ["bash", "-c", "echo 'hi there'"], "env": {"A": "b"}, "cwd": "/",
                 "rows": 24, "cols": 80, "login_shell": True},
        "stdin": {"type": "stdin", "data": "bHMK"},
        "resize": {"type": "resize", "rows": 40, "cols": 120},
        "signal-name": {"type": "signal", "sig": "SIGINT"},
        "signal-number": {"type": "signal", "sig": 9},
        "detach": {"type": "detach"},
        "close": {"type": "close"},
        "attached": {"type": "attached", "pty": {"id": "p1", "pid": 5, "argv": ["sh"], "rows": 24, "cols": 80,
                                                  "alive": True, "exit_code": None, "signal": None, "viewers": 1}},
        "output": {"type": "output", "data": "aGk=", "replay": True},
        "exit": {"type": "exit", "code": 0, "signal": None},
        "ready": {"type": "ready", "pid": 7},
        "error": {"type": "error", "message": "x"},
    }
    for name, frame in frames.items():
        write(t, name, json.dumps(frame))
    write(t, "query", "api_key=ork_abc%2Fdef&x=1+2")


if __name__ == "__main__":
    shutil.rmtree(SEEDS, ignore_errors=True)
    tar_seeds()
    git_seeds()
    manifest_seeds()
    layer_seeds()
    request_seeds()
    upload_seeds()
    pty_seeds()

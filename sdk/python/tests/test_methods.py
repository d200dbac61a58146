"""Every public method, once through the sync client and once through the async one.

Each test body is written once: ``box`` is a busybox sandbox of either client, and
``aw``/``collect``/``ctx`` resolve what the async API returns (see ``helpers``).
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from helpers import aw, collect, ctx

from orchard_env import (
    AsyncSandboxInstance,
    AuthError,
    BadRequestError,
    ExecExit,
    ExecOutput,
    ExecStart,
    NotFoundError,
    OrchardError,
    OrchardTimeoutError,
    SandboxClient,
)

BUSYBOX = "busybox:latest"


def is_async(obj: Any) -> bool:
    return isinstance(obj, AsyncSandboxInstance)


# --- client and lifecycle --------------------------------------------------------------


async def test_client_server_calls(any_client: Any) -> None:
    health = await aw(any_client.health())
    assert health["status"] == "healthy"
    resources = await aw(any_client.resources())
    assert {"status", "nodes", "total_capacity", "available", "sandbox_pods"} <= set(resources)
    images = await aw(any_client.list_images())
    assert any(i.reference.endswith("busybox:latest") for i in images)


async def test_lifecycle(any_client: Any) -> None:
    sb = await aw(any_client.create_sandbox(BUSYBOX, cpu="500m", memory="256Mi", timeout=120))
    sid = sb.sandbox_id
    assert sid.startswith("sdktest-") and sb.id == sid
    assert sb.info.status == "ready" and sb.info.ready
    assert sb.info.cpu == "500m" and sb.info.memory == "256Mi"
    assert sid in any_client.owned_sandboxes
    assert (await aw(sb.refresh())).status == "ready"
    assert (await aw(sb.wait_ready(30))).ready
    assert (await aw(sb.heartbeat()))["status"] == "ok"
    again = await aw(any_client.get_sandbox(sid))
    assert again.sandbox_id == sid and again.image == BUSYBOX
    assert sid in [s.sandbox_id for s in await aw(any_client.list_sandboxes())]
    assert await aw(any_client.delete_sandbox(sid)) is None
    assert sid not in any_client.owned_sandboxes
    with pytest.raises(NotFoundError):
        await aw(any_client.get_sandbox(sid))
    await aw(any_client.delete_sandbox(sid))  # already gone: best effort, never raises
    await aw(sb.delete())  # already gone: quiet


async def test_create_without_wait_then_cleanup_all(any_client: Any) -> None:
    a = await aw(any_client.create_sandbox(BUSYBOX, wait_ready=False))
    b = await aw(
        any_client.create_sandbox(BUSYBOX, sandbox_id=any_client.prefix + "-chosen-" + a.id[-4:])
    )
    assert a.info.status in ("pending", "ready")
    await aw(a.wait_ready(60))
    assert b.sandbox_id.startswith("sdktest-chosen-")
    assert sorted(await aw(any_client.cleanup_all())) == sorted([a.id, b.id])
    assert any_client.owned_sandboxes == []
    with pytest.raises(NotFoundError):
        await aw(any_client.get_sandbox(a.id))


async def test_v1_create_with_env_and_labels(any_client: Any) -> None:
    sb = await aw(any_client.create_sandbox(BUSYBOX, env={"GREETING": "hi"}, labels={"run": "7"}))
    async with ctx(sb):
        assert sb.info.labels == {"run": "7"}
        assert (await aw(sb.run("echo $GREETING"))).stdout == "hi\n"


async def test_detach_keeps_sandbox(any_client: Any) -> None:
    sb = await aw(any_client.create_sandbox(BUSYBOX))
    assert sb.detach() is sb
    assert sb.id not in any_client.owned_sandboxes
    await aw(any_client.cleanup_all())
    assert (await aw(any_client.get_sandbox(sb.id))).id == sb.id
    await aw(sb.delete())


async def test_errors(any_client: Any, server: Any) -> None:
    with pytest.raises(NotFoundError) as err:
        await aw(any_client.get_sandbox("sdktest-nope"))
    assert err.value.status == 404 and err.value.code == "not_found" and err.value.detail
    bad = type(any_client)(api_key="wrong-key")
    try:
        with pytest.raises(AuthError) as auth:
            await aw(bad.list_sandboxes())
        assert auth.value.status == 401
    finally:
        await aw(bad.close())
    with pytest.raises(OrchardError):
        await aw(any_client.create_sandbox("no-such-registry.invalid/none:1", timeout=30))
    assert any_client.owned_sandboxes == []


# --- compatible exec, jobs, patches, files ------------------------------------------------


async def test_exec(box: Any) -> None:
    r = await aw(box.exec("echo 'Hello, Orchard!'"))
    assert (r.stdout, r.stderr, r.exit_code, r.status) == ("Hello, Orchard!\n", "", 0, "succeeded")
    assert r.succeeded and not r.failed and r.is_complete and r.job_id
    assert (await aw(box.exec(["echo", "a b", "$HOME"]))).stdout == "a b $HOME\n"
    assert (await aw(box.exec("pwd", cwd="/tmp"))).stdout == "/tmp\n"
    assert (await aw(box.exec("echo $X-$Y", env={"X": "1", "Y": "2"}))).stdout == "1-2\n"
    failed = await aw(box.exec("echo oops >&2; exit 3"))
    assert failed.failed and failed.exit_code == 3 and failed.stderr == "oops\n"
    assert (await aw(box.exec("echo login", login_shell=True))).stdout == "login\n"
    slow = await aw(box.exec("sleep 30", timeout=1))
    assert slow.failed and slow.error
    job = await aw(box.get_job(r.job_id))
    assert job.job_id == r.job_id and job.stdout == r.stdout and job.sandbox_id == box.id
    assert (await aw(box.wait_job(r.job_id, timeout=5))).succeeded
    with pytest.raises(NotFoundError):
        await aw(box.get_job("job-does-not-exist"))


#: A patch as `git diff` prints it.
PATCH = (
    "diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+three\n"
    "diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n"
    "@@ -0,0 +1 @@\n+new\n"
)
#: The same change as a traditional unified diff (no `diff --git` lines), which
#: `git apply` also accepts.
PLAIN_PATCH = (
    "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+three\n"
    "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+new\n"
)


async def test_apply_patch(box: Any, tmp_path: Path) -> None:
    make_repo(tmp_path / "repo", {"f.txt": "one\ntwo\n"})
    await aw(box.upload_dir(tmp_path / "repo", "/workspace"))
    result = await aw(box.apply_patch(PATCH))
    assert result["success"], result
    assert await aw(box.download_content("/workspace/f.txt")) == b"one\nthree\n"
    assert await aw(box.download_content("/workspace/new.txt")) == b"new\n"
    again = await aw(box.apply_patch(PATCH))
    assert not again["success"] and again["stderr"]


def test_apply_patch_outside_a_repository(sandbox: Any) -> None:
    sandbox.exec("printf 'one\\ntwo\\n' > /workspace/f.txt")
    result = sandbox.apply_patch(PATCH)
    assert result["success"], result
    assert sandbox.download_content("/workspace/f.txt") == b"one\nthree\n"


def test_apply_patch_traditional_unified_diff(sandbox: Any, tmp_path: Path) -> None:
    make_repo(tmp_path / "repo", {"f.txt": "one\ntwo\n"})
    sandbox.upload_dir(tmp_path / "repo", "/workspace")
    result = sandbox.apply_patch(PLAIN_PATCH)
    assert result["success"], result


async def test_compat_files(box: Any, tmp_path: Path) -> None:
    assert (await aw(box.upload_content("hello", "/tmp/c/hello.txt")))["size"] == 5
    assert await aw(box.download_content("/tmp/c/hello.txt")) == b"hello"
    blob = bytes(range(256)) * 10
    local = tmp_path / "blob.bin"
    local.write_bytes(blob)
    assert (await aw(box.upload_file(local, "/tmp/c/blob.bin")))["size"] == len(blob)
    out = tmp_path / "out.bin"
    assert await aw(box.download_file("/tmp/c/blob.bin", out)) == len(blob)
    assert out.read_bytes() == blob
    entries = {e["name"]: e for e in await aw(box.list_files("/tmp/c"))}
    assert entries["hello.txt"]["type"] == "file" and entries["hello.txt"]["size"] == 5
    assert entries["blob.bin"]["size"] == len(blob) and entries["blob.bin"]["modified"]
    with pytest.raises(NotFoundError):
        await aw(box.download_content("/tmp/c/missing"))


# --- /v1 exec and streams ------------------------------------------------------------------


async def test_run(box: Any) -> None:
    r = await aw(box.run(["sh", "-c", "echo out; echo err >&2; exit 2"]))
    assert (r.stdout, r.stderr, r.exit_code, r.ok, r.timed_out) == (
        "out\n",
        "err\n",
        2,
        False,
        False,
    )
    assert r.pid and r.duration_ms >= 0
    assert (await aw(box.run("cat", stdin=b"\x00\xffbin"))).stdout_bytes == b"\x00\xffbin"
    assert (await aw(box.run("echo $A", env={"A": "b"}, cwd="/tmp"))).stdout == "b\n"
    timed = await aw(box.run("sleep 30", timeout=0.3))
    assert timed.timed_out and not timed.ok
    big = await aw(box.run("yes | head -c 100000", max_output_bytes=1000))
    assert big.stdout_truncated and big.stdout_total == 100000 and len(big.stdout_bytes) <= 1100
    with pytest.raises(BadRequestError) as err:
        await aw(box.run("true", cwd="/does/not/exist"))
    assert err.value.code == "cwd_not_found"
    health = await aw(box.agent_health())
    assert health["status"] == "ok" and "limits" in health


async def test_exec_stream(box: Any) -> None:
    events = await collect(box.exec_stream("echo one; echo two >&2; exit 4"))
    assert isinstance(events[0], ExecStart) and isinstance(events[-1], ExecExit)
    assert events[-1].exit_code == 4
    out = b"".join(e.data for e in events if isinstance(e, ExecOutput) and e.stream == "stdout")
    err = b"".join(e.data for e in events if isinstance(e, ExecOutput) and e.stream == "stderr")
    assert (out, err) == (b"one\n", b"two\n")
    # Leaving a with block early closes the connection.
    async with ctx(
        box.exec_stream("for i in 1 2 3; do echo $i; done; sleep 30", kill_on_disconnect=True)
    ) as stream:
        seen = b""
        if is_async(box):
            async for e in stream:
                if isinstance(e, ExecOutput):
                    seen += e.data
                if b"3" in seen:
                    break
        else:
            for e in stream:
                if isinstance(e, ExecOutput):
                    seen += e.data
                if b"3" in seen:
                    break
    assert seen == b"1\n2\n3\n"
    done = box.exec_stream("exit 0")
    await collect(done)
    assert done.exit is not None and done.exit.exit_code == 0


# --- /v1 processes and sessions ------------------------------------------------------------


async def test_processes(box: Any) -> None:
    p = await aw(box.start_process("read x; echo got $x; echo to-err >&2"))
    assert p.info.running and p.pid and p.id
    assert p.id in [q.id for q in await aw(box.list_processes())]
    assert (await aw(box.get_process(p.id))).id == p.id
    await aw(p.write_stdin("it\n", eof=True))
    info = await aw(p.wait(timeout=30))
    assert not info.running and info.exit_code == 0
    out = await aw(p.read_output())
    assert (out.stdout, out.stderr) == (b"got it\n", b"to-err\n")
    assert (await aw(p.read_output())).stdout == b""  # offsets are tracked
    assert (await aw(p.refresh())).state == "exited"

    sleeper = await aw(box.start_process(["sleep", "30"]))
    await aw(sleeper.send_signal("TERM"))
    ended = await aw(sleeper.wait(timeout=30))
    assert ended.exit is not None and ended.exit.signal == 15

    cat = await aw(box.start_process("cat"))
    await aw(cat.write_stdin(b"bytes"))
    await aw(cat.close_stdin())
    assert (await aw(cat.wait(timeout=30))).exit_code == 0
    assert (await aw(cat.read_output())).stdout == b"bytes"

    forever = await aw(box.start_process("sleep 30"))
    still = await aw(forever.wait(timeout=0.2))
    assert still.running
    await aw(forever.kill())
    with pytest.raises(NotFoundError):
        await aw(box.get_process(forever.id))


async def test_sessions(box: Any) -> None:
    async with ctx(box.create_session(cwd="/tmp", env={"S": "1"})) as s:
        assert s.info.alive and s.id
        await aw(s.run("cd / && export X=42 && f() { echo fn$1; }"))
        r = await aw(s.run("echo $PWD $X $S; f 7"))
        assert r.stdout == "/ 42 1\nfn7\n" and r.exit_code == 0 and r.session_alive
        assert (await aw(s.run("exit_code() { return 5; }; exit_code"))).exit_code == 5
        slow = await aw(s.run("sleep 30", timeout=0.3))
        assert slow.timed_out
        assert (await aw(s.run("echo $X"))).stdout == "42\n"  # the shell survived
        assert s.id in [x.id for x in await aw(box.list_sessions())]
        assert (await aw(box.get_session(s.id))).id == s.id
        assert (await aw(s.refresh())).commands >= 4
    assert s.id not in [x.id for x in await aw(box.list_sessions())]


# --- terminals ------------------------------------------------------------------------


async def test_compat_pty(box: Any) -> None:
    async with ctx(box.exec("read name; echo hello $name", pty=True)) as proc:
        assert proc.pid
        await aw(proc.resize(30, 100))
        await aw(proc.write("orchard\n"))
        assert b"hello orchard" in await aw(proc.read_until("hello orchard", timeout=30))
        assert await aw(proc.wait(timeout=30)) == 0
        assert proc.exited and proc.returncode == 0
        proc.read_available()
        assert await aw(proc.read()) == b""
    async with ctx(box.exec(["sh", "-c", "stty size; sleep 30"], pty=True)) as proc:
        assert b"24 80" in await aw(proc.read_until("80", timeout=30))
        await aw(proc.interrupt())
        code = await aw(proc.wait(timeout=30))
        assert code is not None and code != 0
    async with ctx(box.exec("cat", pty=True)) as proc:
        await aw(proc.send_signal("TERM"))
        await aw(proc.wait(timeout=30))
    async with ctx(box.exec("echo a; echo b", pty=True)) as proc:
        chunks = await collect(proc)
        assert b"a\r\nb\r\n" in b"".join(chunks)
    async with ctx(box.exec("head -n 1", pty=True)) as proc:
        assert b"typed" in await aw(proc.communicate("typed\n", timeout=30))


async def test_v1_pty_reattach(box: Any) -> None:
    term = await aw(box.create_pty(rows=20, cols=60))
    assert term.info.alive and (term.info.rows, term.info.cols) == (20, 60)
    async with ctx(term.attach()) as view:
        assert view.pty is not None and view.pty.id == term.id
        await aw(view.write("echo $((6*7))\n"))
        await aw(view.read_until("42", timeout=30))
    # Detached: the terminal lives on; a new viewer gets the scrollback first.
    assert (await aw(term.refresh())).alive
    async with ctx(term.attach()) as view:
        assert b"42" in await aw(view.read_until("42", timeout=30))
        await aw(view.write("stty size\n"))
        await aw(view.read_until("20 60", timeout=30))
    assert (await aw(term.resize(40, 120))).rows == 40
    assert term.id in [t.id for t in await aw(box.list_ptys())]
    same = await aw(box.get_pty(term.id))
    async with ctx(same.attach()) as view:
        await aw(view.write("exit 3\n"))
        assert await aw(view.wait(timeout=30)) == 3
    await aw(term.close())
    async with ctx(box.create_pty(["sh", "-c", "echo scoped"])) as t2:
        async with ctx(t2.attach()) as view:
            await aw(view.read_until("scoped", timeout=30))
    with pytest.raises(NotFoundError):
        await aw(box.get_pty(t2.id))


# --- /v1 files ------------------------------------------------------------------------


async def test_v1_files(box: Any, tmp_path: Path) -> None:
    assert await aw(box.write_file("/tmp/f/a.txt", "text", mode=0o640)) == 4
    st = await aw(box.stat("/tmp/f/a.txt"))
    assert (st.kind, st.size, st.mode, st.name, st.is_file) == ("file", 4, 0o640, "a.txt", True)
    assert await aw(box.write_file("/tmp/f/b.bin", io.BytesIO(b"x" * 70000))) == 70000
    assert await aw(box.write_file("/tmp/f/c.txt", iter([b"ab", b"cd"]))) == 4
    assert await aw(box.read_file("/tmp/f/c.txt")) == b"abcd"
    assert await aw(box.read_file("/tmp/f/c.txt", offset=1, length=2)) == b"bc"
    assert b"".join(await collect(box.iter_file("/tmp/f/b.bin"))) == b"x" * 70000
    local = tmp_path / "up.bin"
    local.write_bytes(os.urandom(300_000))
    assert await aw(box.upload_path(local, "/tmp/f/up.bin")) == 300_000
    assert await aw(box.download_path("/tmp/f/up.bin", tmp_path / "down.bin")) == 300_000
    assert (tmp_path / "down.bin").read_bytes() == local.read_bytes()
    await aw(box.mkdir("/tmp/f/d/e"))
    assert (await aw(box.stat("/tmp/f/d/e"))).is_dir
    await aw(box.move("/tmp/f/a.txt", "/tmp/f/d/a.txt"))
    names = [e.name for e in await aw(box.list_dir("/tmp/f"))]
    assert names == sorted(["b.bin", "c.txt", "d", "up.bin"])
    deep = [e.path for e in await aw(box.list_dir("/tmp/f", depth=3))]
    assert "/tmp/f/d/a.txt" in deep
    await aw(box.remove("/tmp/f/c.txt"))
    await aw(box.remove("/tmp/f/d", recursive=True))
    with pytest.raises(NotFoundError):
        await aw(box.stat("/tmp/f/d"))
    with pytest.raises(NotFoundError):
        await aw(box.read_file("/tmp/f/missing"))


async def test_tar_transfer(box: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "top.txt").write_text("top")
    (src / "sub" / "deep.bin").write_bytes(os.urandom(100_000))
    (src / "link").symlink_to("top.txt")
    result = await aw(box.upload_dir(src, "/tmp/t"))
    assert result.path == "/tmp/t" and result.entries >= 4
    assert (await aw(box.stat("/tmp/t/link"))).kind == "symlink"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"from a tar"
        info = tarfile.TarInfo("x/y.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    assert (await aw(box.upload_tar(buf.getvalue(), "/tmp/t2"))).entries >= 1
    assert await aw(box.read_file("/tmp/t2/x/y.txt")) == b"from a tar"
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(buf.getvalue())
    assert (await aw(box.upload_tar(archive, "/tmp/t3"))).entries >= 1
    size = await aw(box.download_tar("/tmp/t", tmp_path / "t.tar.gz"))
    assert size == (tmp_path / "t.tar.gz").stat().st_size > 0
    sink = io.BytesIO()
    assert await aw(box.download_tar("/tmp/t/top.txt", sink)) == len(sink.getvalue())
    out = tmp_path / "out"
    names = await aw(box.download_dir("/tmp/t", out))
    assert names
    found = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    top = next(p for p in out.rglob("top.txt"))
    assert top.read_text() == "top"
    deep = next(p for p in out.rglob("deep.bin"))
    assert deep.read_bytes() == (src / "sub" / "deep.bin").read_bytes()
    assert any(f.endswith("link") for f in found)


# --- /v1 git -----------------------------------------------------------------------------


def make_repo(path: Path, files: dict[str, str] | None = None) -> None:
    """A local git repository with one commit of ``files``."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    path.mkdir()
    for name, text in (files or {"a.txt": "one\ntwo\n"}).items():
        (path / name).write_text(text)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=path, env=env, check=True)


async def test_git(box: Any, tmp_path: Path) -> None:
    make_repo(tmp_path / "repo")
    await aw(box.upload_dir(tmp_path / "repo", "/tmp/repo"))
    status = await aw(box.git_status("/tmp/repo"))
    assert status.clean and status.branch == "main" and status.head
    await aw(box.write_file("/tmp/repo/a.txt", "one\nTWO\n"))
    await aw(box.write_file("/tmp/repo/new.txt", "new\n"))
    status = await aw(box.git_status("/tmp/repo"))
    assert not status.clean
    assert {(e.path, e.status) for e in status.entries} == {
        ("a.txt", "modified"),
        ("new.txt", "untracked"),
    }
    diff = await aw(box.git_diff("/tmp/repo"))
    assert diff.files_changed == 2 and "+TWO" in diff.patch and "new.txt" in diff.patch
    tracked_only = await aw(box.git_diff("/tmp/repo", include_untracked=False))
    assert tracked_only.files_changed == 1
    commit = await aw(box.git_commit("/tmp/repo", "change", author_name="A", author_email="a@x"))
    assert len(commit.commit) == 40 and commit.files_changed == 2
    assert (await aw(box.git_status("/tmp/repo"))).clean
    reset = await aw(box.git_reset("/tmp/repo", status.head))
    assert reset.head == status.head
    assert await aw(box.read_file("/tmp/repo/a.txt")) == b"one\ntwo\n"
    check = await aw(box.git_apply("/tmp/repo", diff.patch, check_only=True))
    assert check.applied and sorted(check.files) == ["a.txt", "new.txt"]
    applied = await aw(box.git_apply("/tmp/repo", diff.patch))
    assert applied.applied and await aw(box.read_file("/tmp/repo/new.txt")) == b"new\n"
    conflict = await aw(box.git_apply("/tmp/repo", diff.patch))
    assert not conflict.applied and conflict.conflicts
    await aw(box.write_file("/tmp/repo/junk", "x"))
    cleaned = await aw(box.git_reset("/tmp/repo"))
    assert "junk" in cleaned.removed and "new.txt" in cleaned.removed


# --- direct access to the agent ----------------------------------------------------------


async def test_direct(any_client: Any, tmp_path: Path) -> None:
    async with ctx(any_client.create_sandbox(BUSYBOX, direct=True)) as sb:
        assert sb.direct
        r = await aw(sb.run("echo direct"))
        assert r.stdout == "direct\n"
        assert sb.info.agent is not None and sb.info.agent.token
        events = await collect(sb.exec_stream("echo streamed"))
        assert any(isinstance(e, ExecOutput) and e.data == b"streamed\n" for e in events)
        assert await aw(sb.write_file("/tmp/d.txt", "d")) == 1
        assert await aw(sb.read_file("/tmp/d.txt")) == b"d"
        async with ctx(sb.exec("echo via-compat-pty", pty=True)) as proc:
            await aw(proc.read_until("via-compat-pty", timeout=30))
        term = await aw(sb.create_pty(["sh"]))
        async with ctx(term.attach()) as view:
            await aw(view.write("echo attached\n"))
            await aw(view.read_until("attached", timeout=30))
        await aw(term.close())
        # The compatible methods still go through the server.
        assert (await aw(sb.exec("echo job"))).stdout == "job\n"


def test_sync_client_context_deletes_everything(server: Any) -> None:
    with SandboxClient() as c:
        ids = [c.create_sandbox(BUSYBOX).id for _ in range(2)]
        assert set(ids) <= set(server.sandbox_ids())
    assert not set(ids) & set(server.sandbox_ids())


def test_wait_timeout_is_a_timeout_error(client: SandboxClient) -> None:
    sb = client.create_sandbox(BUSYBOX)
    p = sb.start_process("sleep 30")
    assert p.wait(timeout=0.1).running
    with pytest.raises(OrchardTimeoutError):
        with sb.exec("sleep 30", pty=True) as proc:
            proc.read_until("never", timeout=0.3)
    with pytest.raises(TimeoutError):  # the built-in, too
        with sb.exec("sleep 30", pty=True) as proc:
            proc.read(timeout=0.3)
    sb.delete()


# --- images ------------------------------------------------------------------------------


async def test_images(any_client: Any, tmp_path: Path) -> None:
    layout = Path(__file__).resolve().parents[3] / "images/out/busybox"
    name = "sdk-import-test:" + ("sync" if isinstance(any_client, SandboxClient) else "async")
    imported = await aw(any_client.import_image(layout, name))  # a directory, tarred on the fly
    assert [i.reference.endswith(name) for i in imported] == [True]
    assert imported[0].digest and imported[0].size_bytes
    archive = tmp_path / "busybox.tar"
    with tarfile.open(archive, "w") as tf:
        for entry in sorted(layout.iterdir()):
            tf.add(entry, arcname=entry.name)
    again = await aw(any_client.import_image(archive.read_bytes(), name + "-bytes"))
    assert again[0].digest == imported[0].digest
    refs = [i.reference for i in await aw(any_client.list_images())]
    assert any(r.endswith(name) for r in refs) and any(r.endswith(name + "-bytes") for r in refs)
    async with ctx(any_client.create_sandbox(name)) as sb:
        assert (await aw(sb.run("echo imported"))).stdout == "imported\n"
    for ref in (name, name + "-bytes"):
        assert (await aw(any_client.delete_image(ref)))["status"] == "deleted"
    progress: list[dict[str, Any]] = []
    # A loopback registry is refused before any connection (the operator has not allowed
    # it): pulls cannot be turned against the server's own host.
    with pytest.raises(OrchardError, match="loopback or link-local"):
        await aw(any_client.pull_image("127.0.0.1:1/none:latest", on_progress=progress.append))


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_terminal_close_codes_become_errors(flavor: str, server: Any) -> None:
    from orchard_env import AsyncSandboxClient, SandboxInfo, SandboxInstance

    for key, missing, error in [
        (server.api_key, "sdktest-missing", NotFoundError),
        ("wrong-key", "sdktest-missing", AuthError),
    ]:
        if flavor == "sync":
            with SandboxClient(api_key=key) as c:
                sb: Any = SandboxInstance(c, SandboxInfo(sandbox_id=missing))
                with pytest.raises(error):
                    sb.exec("true", pty=True)
        else:
            async with AsyncSandboxClient(api_key=key) as ac:
                asb = AsyncSandboxInstance(ac, SandboxInfo(sandbox_id=missing))
                with pytest.raises(error):
                    await asb.exec("true", pty=True)

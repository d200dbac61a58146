"""Orchard Env's documented SDK examples, written as Orchard users write them.

Only Orchard's names are imported (``orchard_env`` and its ``client`` modules,
``requests``, ``aiohttp``); the facts come from COMPAT.md's "The Python SDK surface
users already call". Everything runs against the session's real ``orchard serve``
(busybox, and python:3.11-slim where the image matters), sync and async.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import requests

import orchard_env
from orchard_env import (
    AsyncContainerProcess,
    AsyncSandbox,
    AsyncSandboxClient,
    AsyncSandboxInstance,
    ContainerProcess,
    JobResult,
    Sandbox,
    SandboxClient,
    SandboxInstance,
)
from orchard_env.client import AsyncSandboxClient as ClientPkgAsyncSandboxClient
from orchard_env.client import SandboxClient as ClientPkgSandboxClient
from orchard_env.client.process import AsyncContainerProcess as ProcessModAsync
from orchard_env.client.process import ContainerProcess as ProcessModSync
from orchard_env.client.sandbox_client import (
    AsyncSandboxClient as ModAsyncSandboxClient,
)
from orchard_env.client.sandbox_client import (
    AsyncSandboxInstance as ModAsyncSandboxInstance,
)
from orchard_env.client.sandbox_client import JobResult as ModJobResult
from orchard_env.client.sandbox_client import SandboxClient as ModSandboxClient
from orchard_env.client.sandbox_client import SandboxInstance as ModSandboxInstance

BUSYBOX = "busybox:latest"
#: An image whose pull fails at once (nothing listens there): the sandbox fails to start.
UNPULLABLE = "127.0.0.1:1/no-such-image:latest"

#: A patch as ``git diff`` prints it (Orchard's apply_patch example).
PATCH = (
    "diff --git a/hello.py b/hello.py\n--- a/hello.py\n+++ b/hello.py\n"
    "@@ -1 +1 @@\n-print('hello')\n+print('hello, patched')\n"
)


# --- module paths, aliases and signatures ---------------------------------------------


def test_module_paths_and_aliases() -> None:
    assert Sandbox is SandboxClient and AsyncSandbox is AsyncSandboxClient
    assert ModSandboxClient is SandboxClient and ClientPkgSandboxClient is SandboxClient
    assert ModAsyncSandboxClient is AsyncSandboxClient
    assert ClientPkgAsyncSandboxClient is AsyncSandboxClient
    assert ModSandboxInstance is SandboxInstance and ModAsyncSandboxInstance is AsyncSandboxInstance
    assert ModJobResult is JobResult
    assert ProcessModSync is ContainerProcess and ProcessModAsync is AsyncContainerProcess
    for name in (
        "SandboxClient",
        "AsyncSandboxClient",
        "SandboxInstance",
        "AsyncSandboxInstance",
        "JobResult",
        "ContainerProcess",
        "AsyncContainerProcess",
        "Sandbox",
        "AsyncSandbox",
    ):
        assert name in orchard_env.__all__


def params(fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    """``(name, default)`` of the parameters after ``self``, up to the first keyword-only one
    (our extras are keyword-only, so Orchard's positional order is what is compared)."""
    out = []
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            break
        out.append((p.name, p.default))
    return out


E = inspect.Parameter.empty

#: COMPAT.md's signatures, method by method (the same for sync and async).
SIGNATURES: dict[str, list[tuple[str, Any]]] = {
    "__init__": [
        ("base_url", None),
        ("timeout", 1200),
        ("auto_cleanup", True),
        ("api_key", None),
        ("prefix", None),
    ],
    "create_sandbox": [
        ("image", E),
        ("block_network", True),
        ("sandbox_id", None),
        ("cpu", None),
        ("memory", None),
        ("timeout", None),
        ("wait_ready", True),
        ("poll_interval", 1.0),
    ],
    "get_sandbox": [("sandbox_id", E)],
    "delete_sandbox": [("sandbox_id", E)],
    "health": [],
    "cleanup_all": [],
    "exec": [
        ("command", E),
        ("timeout", None),
        ("cwd", None),
        ("env", None),
        ("wait", True),
        ("poll_interval", 0.1),
        ("login_shell", False),
        ("pty", False),
        ("rows", 24),
        ("cols", 80),
    ],
    "apply_patch": [("patch", E), ("timeout", 30)],
    "get_job": [("job_id", E)],
    "delete": [],
    "upload_file": [("local_path", E), ("remote_path", E)],
    "upload_content": [("content", E), ("remote_path", E)],
    "download_file": [("remote_path", E), ("local_path", E)],
    "download_content": [("remote_path", E)],
    "list_files": [("remote_path", "/")],
    "start_heartbeat": [("interval", 60)],
    "stop_heartbeat": [],
    "check_env": [("verbose", True)],
    "poll": [],
    "write_stdin": [("data", E)],
    "read": [("timeout", None)],
    "read_all": [("timeout", None)],
    "kill": [("signal_name", "TERM")],
    "resize": [("rows", E), ("cols", E)],
    "wait": [("timeout", None)],
    "close": [],
}

CLIENT_METHODS = ["__init__", "create_sandbox", "get_sandbox", "delete_sandbox", "health"]
INSTANCE_METHODS = [
    "exec",
    "apply_patch",
    "get_job",
    "delete",
    "upload_file",
    "upload_content",
    "download_file",
    "download_content",
    "list_files",
    "start_heartbeat",
    "stop_heartbeat",
    "check_env",
]
PROCESS_METHODS = ["poll", "write_stdin", "read", "read_all", "kill", "resize", "wait", "close"]


@pytest.mark.parametrize(
    "cls, methods",
    [
        (SandboxClient, [*CLIENT_METHODS, "cleanup_all"]),
        (AsyncSandboxClient, [*CLIENT_METHODS, "cleanup_all"]),
        (SandboxInstance, INSTANCE_METHODS),
        (AsyncSandboxInstance, INSTANCE_METHODS),
        (ContainerProcess, PROCESS_METHODS),
        (AsyncContainerProcess, PROCESS_METHODS),
    ],
    ids=lambda v: getattr(v, "__name__", "methods"),
)
def test_signatures_match_compat(cls: type, methods: list[str]) -> None:
    for name in methods:
        assert params(getattr(cls, name)) == SIGNATURES[name], f"{cls.__name__}.{name}"
    if cls in (SandboxClient, AsyncSandboxClient):
        # Orchard's async close(cleanup=True); the sync one takes the same (a superset).
        assert params(cls.close) == [("cleanup", True)]
    if cls is AsyncSandboxInstance:
        assert params(cls.delete_sync) == []
    if cls is AsyncContainerProcess:
        assert inspect.iscoroutinefunction(cls.connect)
    assert inspect.signature(JobResult).parameters.keys() == {"data"}


def test_client_attributes(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with SandboxClient() as client:
        assert client.base_url == server.base_url and client.api_key == server.api_key
        assert (client.timeout, client.max_retries, client.retry_delay) == (1200, 3, 1.0)
        assert client.prefix == "sdktest" and client.session is not None
        client.max_retries, client.retry_delay = 5, 0.5
        assert (client.max_retries, client.retry_delay) == (5, 0.5)
        assert client.health()["status"] == "healthy"
    monkeypatch.delenv("SANDBOX_BASE_URL")
    with SandboxClient(auto_cleanup=False) as client:
        assert client.base_url == "http://localhost:8000"


def test_job_result_from_dict() -> None:
    data = {
        "job_id": "j",
        "sandbox_id": "s",
        "command": "echo hi",
        "status": "succeeded",
        "stdout": "hi\n",
        "stderr": "",
        "exit_code": 0,
        "error": None,
        "created_at": 1702900000.25,
        "started_at": "2023-12-18T11:46:40.5Z",  # what servers sent before epoch floats
        "completed_at": None,
    }
    r = JobResult(data)
    assert (r.job_id, r.sandbox_id, r.command, r.stdout, r.exit_code) == (
        "j",
        "s",
        "echo hi",
        "hi\n",
        0,
    )
    assert (r.created_at, r.started_at, r.completed_at) == (1702900000.25, 1702900000.5, None)
    assert r.succeeded and not r.failed and r.is_complete
    for status in ("queued", "running"):
        assert not JobResult({**data, "status": status}).is_complete


# --- sync examples ---------------------------------------------------------------------


def test_quick_start(python_image: str) -> None:
    with SandboxClient() as client:
        with client.create_sandbox("python:3.11-slim") as sandbox:
            result = sandbox.exec("echo 'Hello, Orchard!'")
            assert result.exit_code == 0 and result.stdout == "Hello, Orchard!\n"
            result = sandbox.exec(["python3", "-c", "print(2 + 2)"])
            assert result.succeeded and result.stdout == "4\n"
            assert sandbox.sandbox_id.startswith("sdktest-")
            assert sandbox.image == "python:3.11-slim" and sandbox.block_network is True
            assert sandbox.namespace is None or isinstance(sandbox.namespace, str)


def test_exec_options_and_jobs(server: Any) -> None:
    with SandboxClient() as client:
        with client.create_sandbox(BUSYBOX, cpu="1", memory="256Mi", timeout=120) as sandbox:
            r = sandbox.exec("echo $GREETING from $(pwd)", cwd="/tmp", env={"GREETING": "hi"})
            assert r.stdout == "hi from /tmp\n" and isinstance(r, JobResult)
            failed = sandbox.exec("echo oops >&2; exit 3")
            assert failed.failed and failed.exit_code == 3 and failed.stderr == "oops\n"
            job = sandbox.exec("sleep 0.5; echo done", wait=False)
            assert job.status == "queued" and not job.is_complete and job.job_id
            # Jobs of a sandbox run one at a time, in order: once the next one has
            # finished, the first has too.
            sandbox.exec("true")
            finished = sandbox.get_job(job.job_id)
            assert finished.succeeded and finished.stdout == "done\n"
            assert finished.sandbox_id == sandbox.sandbox_id
            times = (finished.created_at, finished.started_at, finished.completed_at)
            assert all(isinstance(t, float) for t in times), times
            assert times[0] <= times[1] <= times[2]  # type: ignore[operator]
            slow = sandbox.exec("sleep 30", timeout=1)
            assert slow.failed and slow.exit_code == 124 and slow.error


def test_files_and_patches(server: Any, tmp_path: Path) -> None:
    with SandboxClient() as client:
        with client.create_sandbox(BUSYBOX) as sandbox:
            local = tmp_path / "hello.py"
            local.write_text("print('hello')\n")
            assert sandbox.upload_file(str(local), "/workspace/hello.py")["success"]
            up = sandbox.upload_content(b"\x00\x01binary", "/workspace/data.bin")
            assert up["size"] == 8
            result = sandbox.apply_patch(PATCH)
            assert result["success"] and result["exit_code"] == 0, result
            assert sandbox.download_content("/workspace/hello.py") == b"print('hello, patched')\n"
            out = tmp_path / "data.bin"
            assert sandbox.download_file("/workspace/data.bin", str(out)) == 8
            assert out.read_bytes() == b"\x00\x01binary"
            files = {f["name"]: f for f in sandbox.list_files("/workspace")}
            assert files["hello.py"]["type"] == "file" and files["data.bin"]["size"] == 8
            assert "workspace" in [f["name"] for f in sandbox.list_files()]  # default "/"
            again = sandbox.apply_patch(PATCH)  # applied already: the context is gone
            assert not again["success"] and again["stderr"]


def heartbeat_counter(hooks: dict[str, list[Any]], asynchronous: bool) -> threading.Event:
    """Sets the returned event once two heartbeats were answered 200 (via httpx hooks)."""
    seen: list[int] = []
    done = threading.Event()

    def count(response: httpx.Response) -> None:
        if response.request.url.path.endswith("/heartbeat") and response.status_code == 200:
            seen.append(1)
            if len(seen) >= 2:
                done.set()

    async def acount(response: httpx.Response) -> None:
        count(response)

    hooks["response"].append(acount if asynchronous else count)
    return done


def test_heartbeats(server: Any) -> None:
    with SandboxClient() as client:
        beats = heartbeat_counter(client.session.event_hooks, asynchronous=False)
        with client.create_sandbox(BUSYBOX) as sandbox:
            sandbox.start_heartbeat(interval=0.1)
            sandbox.start_heartbeat(interval=0.1)  # already running: nothing more
            assert beats.wait(30), "no heartbeats posted"
            sandbox.stop_heartbeat()
            beats2 = heartbeat_counter(client.session.event_hooks, asynchronous=False)
            sandbox.start_heartbeat(interval=0.1)
            assert beats2.wait(30)
        # delete() stopped the thread: no heartbeat thread of this sandbox is left.
        assert not [t for t in threading.enumerate() if t.name.endswith(sandbox.sandbox_id)]


def test_check_env(python_image: str, capsys: pytest.CaptureFixture[str]) -> None:
    with SandboxClient() as client:
        with client.create_sandbox("python:3.11-slim") as sandbox:
            info = sandbox.check_env()
            assert "Environment Check" in capsys.readouterr().out
            for key in (
                "bashrc_loaded",
                "conda_available",
                "conda_env",
                "conda_prefix",
                "path",
                "bare_path",
                "python",
                "python3",
                "python_version",
            ):
                assert key in info, key
            assert info["python3"].endswith("/python3")
            assert info["python_version"].startswith("Python 3.11")
            assert "/usr/bin" in info["path"] and "/usr/bin" in info["bare_path"]
            assert info["conda_available"] is False and info["conda_env"] is None
            # A ~/.bashrc that changes the environment is seen as loaded by a login shell.
            sandbox.exec("echo 'export PATH=/opt/probe/bin:$PATH' >> ~/.bashrc")
            info = sandbox.check_env(verbose=False)
            assert capsys.readouterr().out == ""
            assert info["bashrc_loaded"] is True, info
            assert info["path"].startswith("/opt/probe/bin:")
            assert "/opt/probe/bin" not in info["bare_path"]


def test_check_env_and_login_shells_on_a_swe_bench_style_image(swe_image: str) -> None:
    # The image's ~/.bashrc activates `testbed` after its non-interactive guard, as
    # SWE-bench's images do: only a login shell gets there, and its noise stays out.
    with SandboxClient() as client:
        with client.create_sandbox(swe_image) as sandbox:
            info = sandbox.check_env(verbose=False)
            assert info["bashrc_loaded"] is True, info
            assert info["conda_env"] == "testbed", info
            assert info["python"] == "/opt/miniconda3/envs/testbed/bin/python", info
            assert info["bare_path"] and "testbed" not in info["bare_path"], info
            job = sandbox.exec(
                "python -c 'import sys; print(sys.prefix)'; testbed-tool", login_shell=True
            )
            assert job.succeeded, job.stderr
            assert job.stdout.endswith("testbed-tool\n")
            assert job.stderr == ""
            bare = sandbox.exec("command -v testbed-tool || echo missing")
            assert bare.stdout == "missing\n"


def test_context_managers_and_cleanup_all(server: Any) -> None:
    with SandboxClient() as client:
        kept = client.create_sandbox(BUSYBOX)  # no `with`: the client's exit deletes it
        assert kept.exec("echo alive").stdout == "alive\n"
    with SandboxClient() as client:
        a = client.create_sandbox(BUSYBOX, wait_ready=False)
        b = client.create_sandbox(BUSYBOX, wait_ready=False)
        client.cleanup_all()
        for sid in (kept.sandbox_id, a.sandbox_id, b.sandbox_id):
            with pytest.raises(requests.exceptions.HTTPError) as info:
                client.get_sandbox(sid)
            assert info.value.response.status_code == 404
        client.delete_sandbox(a.sandbox_id)  # already gone: best effort, no error


def test_error_handling(server: Any) -> None:
    try:
        with SandboxClient() as client:
            client.get_sandbox("sdktest-no-such-sandbox")
    except requests.exceptions.HTTPError as e:
        assert e.response.status_code == 404
        assert "sdktest-no-such-sandbox" in e.response.json()["detail"]
        assert "sdktest-no-such-sandbox" in e.response.text
        assert e.response.headers["content-type"].startswith("application/json")
    else:
        pytest.fail("no HTTPError")
    with SandboxClient(api_key="wrong-key") as client:
        with pytest.raises(requests.exceptions.HTTPError) as info:
            client.create_sandbox(BUSYBOX)
        assert info.value.response.status_code in (401, 403)
    with SandboxClient() as client:
        sandbox = client.create_sandbox(BUSYBOX)
        sandbox.delete()
        with pytest.raises(RuntimeError):
            sandbox.exec("echo too late")
        with pytest.raises(RuntimeError):
            sandbox.list_files()


def test_failed_sandbox_raises_runtime_error(server: Any) -> None:
    with SandboxClient() as client:
        with pytest.raises(RuntimeError):
            client.create_sandbox(UNPULLABLE)
        assert client.cleanup_all() == []


def test_pty_session(server: Any) -> None:
    with SandboxClient() as client:
        with client.create_sandbox(BUSYBOX) as sandbox:
            proc = sandbox.exec("cat", pty=True)
            assert isinstance(proc, ContainerProcess) and proc.pid
            assert proc.poll() is None and proc.returncode is None
            proc.write_stdin(b"hello pty\n")
            seen = b""
            while b"hello pty\r\n" not in seen:
                seen += proc.read(timeout=30)
            # Orchard's process has a reader thread: reads in one thread while another
            # types, and poll() never waits for the reader.
            seen_by_reader: list[bytes] = []

            def reader() -> None:
                got = b""
                while b"from main\r\n" not in got:
                    got += proc.read(timeout=30)
                seen_by_reader.append(got)

            thread = threading.Thread(target=reader)
            thread.start()
            proc.write_stdin("from main\n")
            assert proc.poll() is None
            thread.join(60)
            assert seen_by_reader and b"from main" in seen_by_reader[0]
            proc.kill("TERM")
            assert proc.wait(timeout=30) == 128 + 15
            assert proc.poll() == 143 and proc.returncode == 143
            proc.close()

            proc = sandbox.exec(["sh", "-c", "read x; stty size; echo got $x"], pty=True, rows=30)
            proc.resize(40, 100)
            proc.write_stdin("go\n")
            out = proc.read_all(timeout=30)
            assert b"40 100" in out and b"got go" in out, out
            assert proc.wait(timeout=5) == 0 and proc.read(timeout=1) == b""
            proc.close()

            with sandbox.exec("sleep 30", pty=True) as proc:
                with pytest.raises(TimeoutError):
                    proc.wait(timeout=0.5)
                proc.kill("KILL")
                assert proc.wait(timeout=30) == 128 + 9


# --- async examples ----------------------------------------------------------------------


def test_pty_string_commands_run_under_bash(python_image: str) -> None:
    # Orchard runs a string command on a terminal as ["bash", "-c", command].
    with SandboxClient() as client:
        with client.create_sandbox("python:3.11-slim") as sandbox:
            bashisms = '[[ -n "$BASH_VERSION" ]] && source /dev/null && echo under-bash'
            proc = sandbox.exec(bashisms, pty=True)
            assert b"under-bash" in proc.read_all(timeout=30) and proc.wait(timeout=5) == 0
            proc.close()


async def test_async_quick_start_and_jobs(python_image: str) -> None:
    async with AsyncSandboxClient() as client:
        assert (await client.health())["status"] == "healthy"
        async with await client.create_sandbox("python:3.11-slim") as sandbox:
            result = await sandbox.exec("echo 'Hello, Orchard!'")
            assert result.exit_code == 0 and result.stdout == "Hello, Orchard!\n"
            job = await sandbox.exec("echo later", wait=False)
            assert job.status == "queued"
            await sandbox.exec("true")
            finished = await sandbox.get_job(job.job_id)
            assert finished.succeeded and finished.stdout == "later\n"
            assert isinstance(finished.completed_at, float)
            info = await sandbox.check_env(verbose=False)
            assert info["python3"].endswith("/python3") and info["bashrc_loaded"] is False


async def test_async_files_heartbeats_and_cleanup(server: Any, tmp_path: Path) -> None:
    client = AsyncSandboxClient()
    beats = heartbeat_counter(client.session.event_hooks, asynchronous=True)
    sandbox = await client.create_sandbox(BUSYBOX)
    local = tmp_path / "hello.py"
    local.write_text("print('hello')\n")
    assert (await sandbox.upload_file(str(local), "/workspace/hello.py"))["success"]
    assert (await sandbox.apply_patch(PATCH))["success"]
    assert await sandbox.download_content("/workspace/hello.py") == b"print('hello, patched')\n"
    assert await sandbox.download_file("/workspace/hello.py", str(tmp_path / "o")) == 24
    await sandbox.upload_content(b"x", "/workspace/x.txt")
    assert "x.txt" in [f["name"] for f in await sandbox.list_files("/workspace")]
    sandbox.start_heartbeat(interval=0.1)
    await asyncio.wait_for(asyncio.to_thread(beats.wait, 30), 35)
    assert beats.is_set()
    other = await client.create_sandbox(BUSYBOX, wait_ready=False)
    await client.cleanup_all()  # deletes both; the heartbeat task keeps failing quietly
    sandbox.stop_heartbeat()
    for sid in (sandbox.sandbox_id, other.sandbox_id):
        with pytest.raises(aiohttp.ClientResponseError) as info:
            await client.get_sandbox(sid)
        assert info.value.status == 404 and info.value.message
        assert info.value.headers["content-type"].startswith("application/json")
    await client.close(cleanup=True)


async def test_async_errors_and_delete_sync(server: Any) -> None:
    async with AsyncSandboxClient() as client:
        try:
            await client.get_sandbox("sdktest-no-such-sandbox")
        except aiohttp.ClientResponseError as e:
            assert e.status == 404 and "sdktest-no-such-sandbox" in e.message
        else:
            pytest.fail("no ClientResponseError")
        sandbox = await client.create_sandbox(BUSYBOX)
        sandbox.delete_sync()
        with pytest.raises(RuntimeError):
            await sandbox.exec("echo too late")
        with pytest.raises(aiohttp.ClientResponseError):
            await client.get_sandbox(sandbox.sandbox_id)
        with pytest.raises(RuntimeError):
            await client.create_sandbox(UNPULLABLE)


def test_async_delete_sync_after_the_loop_closed(server: Any) -> None:
    # Orchard's delete_sync is for cleanup code that runs when no event loop does.
    async def make() -> tuple[AsyncSandboxClient, AsyncSandboxInstance]:
        client = AsyncSandboxClient(auto_cleanup=False)
        sandbox = await client.create_sandbox(BUSYBOX)
        sandbox.start_heartbeat(interval=60)
        return client, sandbox

    client, sandbox = asyncio.run(make())  # the loop is closed when this returns
    sandbox.delete_sync()
    with SandboxClient() as sync_client:
        with pytest.raises(requests.exceptions.HTTPError) as info:
            sync_client.get_sandbox(sandbox.sandbox_id)
        assert info.value.response.status_code == 404


async def test_async_pty_session(server: Any) -> None:
    async with AsyncSandboxClient() as client:
        async with await client.create_sandbox(BUSYBOX) as sandbox:
            proc = await sandbox.exec("cat", pty=True)
            assert isinstance(proc, AsyncContainerProcess) and proc.pid
            assert proc.poll() is None
            await proc.write_stdin(b"hello pty\n")
            seen = b""
            while b"hello pty\r\n" not in seen:
                seen += await proc.read(timeout=30)
            await proc.kill("TERM")
            assert await proc.wait(timeout=30) == 143
            assert proc.poll() == 143 and proc.returncode == 143
            await proc.close()

            proc = await sandbox.exec(["sh", "-c", "read x; stty size; echo got $x"], pty=True)
            await proc.resize(40, 100)
            await proc.write_stdin("go\n")
            out = await proc.read_all(timeout=30)
            assert b"40 100" in out and b"got go" in out, out
            assert await proc.wait(timeout=5) == 0
            await proc.close()

            # poll() needs no await of its own: Orchard code polls between other work.
            proc = await sandbox.exec("read x; exit 7", pty=True)
            await proc.write_stdin("go\n")

            async def exited() -> int:
                while (code := proc.poll()) is None:
                    await asyncio.sleep(0.05)
                return code

            assert await asyncio.wait_for(exited(), 30) == 7
            await proc.close()

            # Orchard's way of opening one by hand: the WebSocket URL and the init frame.
            base = client.base_url.replace("http://", "ws://")
            url = f"{base}/sandboxes/{sandbox.sandbox_id}/exec/pty?api_key={client.api_key}"
            init = (
                '{"type": "init", "cmd": ["sh", "-c", "echo connected"], "env": {},'
                ' "rows": 24, "cols": 80}'
            )
            proc = await AsyncContainerProcess.connect(url, init)
            assert b"connected" in await proc.read_all(timeout=30)
            assert await proc.wait(timeout=5) == 0
            await proc.close()

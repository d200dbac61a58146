"""The API surface, without a server: sync/async parity, docstrings, pure logic."""

from __future__ import annotations

import inspect
import io
import json
import pickle
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import aiohttp
import httpx
import pytest
import requests

import orchard_env
from orchard_env import (
    AsyncContainerProcess,
    AsyncExecStream,
    AsyncProcess,
    AsyncSandboxClient,
    AsyncSandboxInstance,
    AsyncSession,
    AsyncTerminal,
    ContainerProcess,
    ExecStream,
    Process,
    RetryPolicy,
    SandboxClient,
    SandboxInstance,
    Session,
    Terminal,
    errors,
)
from orchard_env._config import resolve_config
from orchard_env._http import Reply, Request
from orchard_env._ops import create_sandbox, delete_sandbox, exec_job
from orchard_env._retry import Idempotency
from orchard_env._streams import NdjsonDecoder, exec_event, tar_directory

PAIRS = [
    (SandboxClient, AsyncSandboxClient),
    (SandboxInstance, AsyncSandboxInstance),
    (ContainerProcess, AsyncContainerProcess),
    (Process, AsyncProcess),
    (Session, AsyncSession),
    (Terminal, AsyncTerminal),
    (ExecStream, AsyncExecStream),
]

#: Async methods that are not coroutine functions, and why.
NOT_COROUTINES = {  # (and SandboxInstance.detach: no I/O)
    "create_sandbox",  # returns an awaitable that is also an async context manager
    "exec_stream",  # returns an async iterator
    "iter_file",  # an async generator
    "read_available",  # no I/O
    "poll",  # Orchard's AsyncContainerProcess.poll is a plain method (no I/O)
    "start_heartbeat",  # starts a task; Orchard's is a plain method
    "stop_heartbeat",  # cancels the task; Orchard's is a plain method
    "delete_sync",  # for synchronous cleanup code, by definition
}

#: Methods only the async classes have (Orchard's async-only calls).
ASYNC_ONLY = {
    "delete_sync",  # AsyncSandboxInstance: delete from synchronous code
    "connect",  # AsyncContainerProcess.connect(ws_url, init_frame)
}


def public(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


@pytest.mark.parametrize("sync_cls, async_cls", PAIRS, ids=lambda c: c.__name__)
def test_sync_and_async_have_the_same_methods(sync_cls: type, async_cls: type) -> None:
    sync_members, async_members = public(sync_cls), public(async_cls)
    renamed = {"close": "aclose"} if sync_cls is ExecStream else {}
    assert {renamed.get(n, n) for n in sync_members} == set(async_members) - ASYNC_ONLY
    for name, member in sync_members.items():
        twin = async_members[renamed.get(name, name)]
        if isinstance(member, property):
            assert isinstance(twin, property), name
            continue
        sig, asig = inspect.signature(member), inspect.signature(twin)  # type: ignore[arg-type]
        assert list(sig.parameters) == list(asig.parameters), name
        for p, q in zip(sig.parameters.values(), asig.parameters.values(), strict=True):
            assert (p.kind, p.default) == (q.kind, q.default), (
                f"{sync_cls.__name__}.{name}({p.name})"
            )
        assert not inspect.iscoroutinefunction(member), name
        if name in NOT_COROUTINES or (name == "detach" and sync_cls is SandboxInstance):
            continue
        assert inspect.iscoroutinefunction(twin) or inspect.isasyncgenfunction(twin), name


def test_the_sync_client_is_generated_from_the_async_one() -> None:
    # The sync modules are made from aio.py and the _aio_*.py modules by scripts/unasync.py
    # and committed; an edit of either side alone makes this fail with the diff.
    script = Path(__file__).resolve().parents[1] / "scripts" / "unasync.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("edit", ["generated", "source"])
def test_the_generation_check_fails_when_a_sync_module_is_stale(tmp_path: Path, edit: str) -> None:
    # On a copy of the SDK: a hand edit of a generated module, or an edit of an async one
    # that was not generated again.
    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "scripts", tmp_path / "scripts")
    shutil.copytree(root / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(root / "pyproject.toml", tmp_path)
    package = tmp_path / "src" / "orchard_env"
    path = package / ("_sync_git.py" if edit == "generated" else "_aio_git.py")
    path.write_text(path.read_text().replace("Branch, HEAD", "The branch, HEAD"))
    done = subprocess.run(
        [sys.executable, str(tmp_path / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "out of date: _sync_git.py" in done.stderr
    assert '"""Branch, HEAD' in done.stdout  # the diff shows the change


def test_every_public_name_is_documented() -> None:
    missing = []
    for name in orchard_env.__all__:
        obj = getattr(orchard_env, name)
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        # The clients are made of a class per capability: their members too.
        for cls in obj.__mro__:
            if not cls.__module__.startswith("orchard_env"):
                continue
            for attr, member in vars(cls).items():
                if attr.startswith("_") or not (callable(member) or isinstance(member, property)):
                    continue
                if not (inspect.getdoc(member) or "").strip():
                    missing.append(f"{name}.{attr} ({cls.__qualname__})")
    assert missing == []


def test_compat_signatures() -> None:
    sig = inspect.signature(SandboxClient)
    assert list(sig.parameters)[:5] == ["base_url", "timeout", "auto_cleanup", "api_key", "prefix"]
    assert sig.parameters["timeout"].default == 1200
    create = inspect.signature(SandboxClient.create_sandbox)
    assert list(create.parameters)[1:9] == [
        "image",
        "block_network",
        "sandbox_id",
        "cpu",
        "memory",
        "timeout",
        "wait_ready",
        "poll_interval",
    ]
    assert create.parameters["timeout"].default is None
    exec_ = inspect.signature(SandboxInstance.exec)
    assert list(exec_.parameters)[1:] == [
        "command",
        "timeout",
        "cwd",
        "env",
        "wait",
        "poll_interval",
        "login_shell",
        "pty",
        "rows",
        "cols",
    ]
    assert inspect.signature(SandboxInstance.apply_patch).parameters["timeout"].default == 30
    for name in (
        "upload_file",
        "upload_content",
        "download_file",
        "download_content",
        "list_files",
        "get_job",
        "delete",
    ):
        assert hasattr(SandboxInstance, name) and hasattr(AsyncSandboxInstance, name)
    for name in ("health", "create_sandbox", "get_sandbox", "delete_sandbox", "cleanup_all"):
        assert hasattr(SandboxClient, name) and hasattr(AsyncSandboxClient, name)
    for prop in ("succeeded", "failed", "is_complete"):
        assert isinstance(getattr(orchard_env.JobResult, prop), property)


def test_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_BASE_URL", "http://example.invalid:1/")
    monkeypatch.setenv("SANDBOX_API_KEY", "k")
    monkeypatch.setenv("SANDBOX_PREFIX", "exp")
    config = resolve_config(None, None, None, 5, None, False)
    assert (config.base_url, config.api_key, config.prefix) == (
        "http://example.invalid:1",
        "k",
        "exp",
    )
    assert "k" not in repr(config)
    explicit = resolve_config("http://h", "other", "p", 5, None, False)
    assert (explicit.base_url, explicit.api_key, explicit.prefix) == ("http://h", "other", "p")
    monkeypatch.delenv("SANDBOX_BASE_URL")
    assert resolve_config(None, None, None, 5, None, False).base_url == "http://localhost:8000"


def test_retry_decisions() -> None:
    policy = RetryPolicy(attempts=3)
    request = httpx.Request("POST", "http://x")
    refused = httpx.ConnectError("refused", request=request)
    broken = httpx.RemoteProtocolError("server disconnected", request=request)
    read_timeout = httpx.ReadTimeout("slow", request=request)
    for error in (refused, httpx.ConnectTimeout("t"), httpx.PoolTimeout("t")):
        assert policy.should_retry_error(Idempotency.UNSENT, error, 1)
    for error in (broken, read_timeout, httpx.WriteError("w"), httpx.ReadError("r")):
        assert not policy.should_retry_error(Idempotency.UNSENT, error, 1)
        assert policy.should_retry_error(Idempotency.SAFE, error, 1)
    assert policy.should_retry_error(Idempotency.SAFE, refused, 3)
    assert not policy.should_retry_error(Idempotency.SAFE, refused, 4)
    assert policy.should_retry_status(503, 1) and not policy.should_retry_status(500, 1)
    assert not policy.should_retry_status(503, 4)


def test_backoff_is_exponential_with_jitter() -> None:
    policy = RetryPolicy(backoff=0.5, max_backoff=3)
    for attempt, top in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (9, 3.0)]:
        delays = {policy.delay(attempt) for _ in range(50)}
        assert all(top / 2 <= d <= top for d in delays)
        assert len(delays) > 1  # jittered
    # A 503 waits its Retry-After (5 s without one, 60 s at most) plus up to 2 s of jitter.
    for retry_after, base in [("2", 2.0), (None, 5.0), ("soon", 5.0), ("1e9", 60.0)]:
        waits = {policy.delay_unavailable(retry_after) for _ in range(50)}
        assert all(base <= w <= base + 2.0 for w in waits) and len(waits) > 1


def test_errors_from_both_bodies() -> None:
    e = errors.error_from_body(404, b'{"detail": "no sandbox", "code": "not_found"}')
    assert isinstance(e, errors.NotFoundError) and (e.status, e.code, e.detail) == (
        404,
        "not_found",
        "no sandbox",
    )
    e = errors.error_from_body(429, b'{"code": "too_many_execs", "message": "busy"}')
    assert isinstance(e, errors.QuotaError) and e.code == "too_many_execs" and e.detail == "busy"
    e = errors.error_from_body(408, b'{"detail": "not ready"}')
    assert isinstance(e, errors.OrchardTimeoutError) and isinstance(e, TimeoutError)
    assert e.code == "timeout"
    assert isinstance(errors.error_from_body(502, b"bad gateway"), errors.SandboxError)
    assert isinstance(errors.error_from_body(503, b""), errors.UnavailableError)
    assert isinstance(errors.error_from_body(401, b"{}"), errors.AuthError)
    assert isinstance(errors.error_from_body(403, b"{}"), errors.AuthError)
    assert isinstance(
        errors.error_from_body(422, b'{"detail": [{"loc": 1}]}'), errors.BadRequestError
    )
    assert isinstance(errors.error_from_body(599, b""), errors.ServerError)
    assert issubclass(errors.OrchardConnectionError, ConnectionError)
    for cls in (errors.NotFoundError, errors.AuthError, errors.QuotaError):
        assert issubclass(cls, errors.OrchardError)


def reply(status: int, body: object, attempts: int = 1) -> Reply:
    return Reply(status, httpx.Headers(), json.dumps(body).encode(), attempts)


def test_create_retry_that_finds_its_own_sandbox() -> None:
    op = create_sandbox("img", prefix="p")
    first = next(op)
    assert first.idempotency is Idempotency.SAFE and first.path == "/sandboxes"
    sid = first.json["sandbox_id"]
    assert sid.startswith("p-")
    again = op.send(reply(409, {"detail": "exists"}, attempts=2))
    assert (again.method, again.path) == ("GET", f"/sandboxes/{sid}")
    with pytest.raises(StopIteration) as stop:
        op.send(reply(200, {"sandbox_id": sid, "status": "running", "ready": True}))
    assert stop.value.value.sandbox_id == sid
    # A 409 on the first attempt is someone else's sandbox: an error.
    op = create_sandbox("img", prefix="p")
    next(op)
    with pytest.raises(errors.ConflictError):
        op.send(reply(409, {"detail": "exists"}, attempts=1))


def test_exec_submit_is_only_retried_unsent_and_waits_are_safe() -> None:
    op = exec_job("sb", ["ls", "-l"], timeout=5, wait_limit=60, env={"A": "1"})
    submit: Request = next(op)
    assert submit.idempotency is Idempotency.UNSENT
    assert submit.json == {
        "command": ["ls", "-l"],
        "timeout_seconds": 5,
        "env": {"A": "1"},
        "login_shell": False,
        "wait": False,
    }
    wait = op.send(reply(200, {"job_id": "j1", "status": "queued"}))
    assert wait.idempotency is Idempotency.SAFE and wait.path == "/jobs/j1/wait"
    running = op.send(reply(200, {"job_id": "j1", "status": "running"}))
    assert running.path == "/jobs/j1/wait"  # not finished: wait again
    with pytest.raises(StopIteration) as stop:
        op.send(reply(200, {"job_id": "j1", "status": "succeeded", "stdout": "x", "exit_code": 0}))
    assert stop.value.value.succeeded


def test_http_errors_are_requests_and_aiohttp_errors_and_pickle() -> None:
    e = errors.error_from_body(
        404,
        b'{"detail": "no sandbox x", "code": "not_found"}',
        headers={"Content-Type": "application/json", "x-request-id": "r1"},
        method="GET",
        url="http://h/sandboxes/x",
    )
    for err in (e, pickle.loads(pickle.dumps(e))):
        assert isinstance(err, requests.exceptions.HTTPError)
        assert isinstance(err, aiohttp.ClientResponseError)
        assert isinstance(err, errors.NotFoundError)
        assert err.response.status_code == 404 and err.response.json()["detail"] == "no sandbox x"
        assert "no sandbox x" in err.response.text and err.response.headers["X-Request-Id"] == "r1"
        assert (err.status, err.message, err.headers["x-request-id"]) == (404, "no sandbox x", "r1")
        assert err.code == "not_found" and err.request_info.method == "GET"
    failed = errors.error_from_body(502, b'{"detail": "sandbox x failed"}')
    assert isinstance(failed, RuntimeError) and isinstance(failed, requests.exceptions.HTTPError)
    timeout = errors.error_from_body(408, b"{}")
    assert isinstance(timeout, TimeoutError) and isinstance(timeout, aiohttp.ClientResponseError)
    assert isinstance(errors.SandboxDeletedError("gone"), RuntimeError)
    assert isinstance(errors.OrchardConnectionError("x"), requests.exceptions.ConnectionError)


def test_exec_never_returns_a_running_job() -> None:
    # As in Orchard's SDK: a job unfinished when the wait is over is a TimeoutError.
    op = exec_job("sb", "sleep 999", timeout=None, wait_limit=0)
    next(op)
    op.send(reply(200, {"job_id": "j1", "status": "queued"}))
    with pytest.raises(TimeoutError, match="did not complete"):
        op.send(reply(200, {"job_id": "j1", "status": "running"}))


def test_delete_404_after_a_retry_is_success() -> None:
    op = delete_sandbox("sb")
    next(op)
    with pytest.raises(StopIteration) as stop:
        op.send(reply(404, {"detail": "gone"}, attempts=2))
    assert stop.value.value is False
    op = delete_sandbox("sb")
    next(op)
    with pytest.raises(errors.NotFoundError):
        op.send(reply(404, {"detail": "gone"}, attempts=1))


def test_ndjson_and_exec_events() -> None:
    d = NdjsonDecoder()
    frames = d.feed(b'{"type":"start","pid":3}\n{"type":"stdout","data":"aGk="}\n{"type":"ex')
    frames += d.feed(
        b'it","exit_code":1,"timed_out":false,"duration_ms":1,"stdout_bytes":2,"stderr_bytes":0}'
    )
    frames += d.end()
    events = [exec_event(f) for f in frames]
    assert [type(e).__name__ for e in events] == ["ExecStart", "ExecOutput", "ExecExit"]
    with pytest.raises(errors.BadRequestError) as err:
        exec_event({"type": "error", "code": "cwd_not_found", "message": "no /x"})
    assert err.value.code == "cwd_not_found"


def test_tar_directory_streams_a_valid_archive(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "d").mkdir()
    (root / "d" / "big.bin").write_bytes(b"z" * 700_000)
    (root / "a").write_text("a")
    (root / ("long-" + "n" * 150)).write_text("long name")
    (root / "ln").symlink_to("a")
    chunks = list(tar_directory(root, size=65536))
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tf:
        names = tf.getnames()
        assert sorted(names) == sorted(["a", "d", "d/big.bin", "ln", "long-" + "n" * 150])
        assert tf.extractfile("d/big.bin").read() == b"z" * 700_000  # type: ignore[union-attr]
        assert tf.getmember("ln").issym()


def test_a_forked_child_does_not_own_the_parents_sandboxes() -> None:
    import os

    from orchard_env import _cleanup

    _cleanup.register("http://127.0.0.1:9", None, "sdktest-parents")
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if _cleanup.pending() == [] else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert "sdktest-parents" in _cleanup.pending()
    finally:
        _cleanup.unregister("http://127.0.0.1:9", None, "sdktest-parents")

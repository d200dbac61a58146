"""Every request the SDK makes, and how every answer is read: sans-I/O operations.

An operation is a generator: it yields :class:`~._http.Request` values and gets a
:class:`~._http.Reply` back for each (error statuses are raised by the driver unless
the request lists them in ``ok``). Multi-step operations (create then wait; submit a
job then wait for it) are written once here and run by both the sync and the async
driver. Requests with ``agent=True`` are routes of a sandbox's agent API.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from ._config import new_sandbox_id
from ._http import WAIT_MARGIN, Op, Request
from ._retry import Idempotency
from .errors import OrchardTimeoutError, error_from_body
from .models import (
    ExecResult,
    ExtractResult,
    FileEntry,
    FileStat,
    GitApplyResult,
    GitCommitResult,
    GitDiff,
    GitResetResult,
    GitStatus,
    ImageInfo,
    JobResult,
    PatchResult,
    ProcessInfo,
    ProcessOutput,
    PtyInfo,
    SandboxInfo,
    SessionInfo,
    SessionResult,
    Snapshot,
)

SAFE = Idempotency.SAFE
UNSENT = Idempotency.UNSENT

#: Longest single server-side wait; longer waits are a loop of these, so that no proxy
#: between client and server sees a request idle for many minutes.
WAIT_CHUNK = 60.0

#: How often a sandbox that waits for a node says so (Orchard's SDK: every 30 s); a
#: sandbox's wait is a loop of server-side waits this long, each followed by a look at
#: its status.
NODE_REPORT_EVERY = 30.0

Command = str | Sequence[str]


def _seg(value: str) -> str:
    """A path segment, percent-encoded."""
    return quote(str(value), safe="")


def _command(command: Command) -> str | list[str]:
    if isinstance(command, str):
        return command
    return [str(c) for c in command]


def _clean(body: dict[str, Any]) -> dict[str, Any]:
    """Drops ``None`` values (the server's defaults apply)."""
    return {k: v for k, v in body.items() if v is not None}


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def _read_timeout(seconds: float | None) -> float | None:
    """Read time-out of a request that may legitimately take ``seconds``."""
    return None if seconds is None else seconds + WAIT_MARGIN


def _stdin_fields(stdin: str | bytes | None) -> dict[str, Any]:
    if stdin is None:
        return {}
    if isinstance(stdin, bytes):
        return {"stdin_b64": base64.b64encode(stdin).decode()}
    return {"stdin": stdin}


# --- server ------------------------------------------------------------------------


def health() -> Op[dict[str, Any]]:
    """``GET /health``."""
    reply = yield Request("GET", "/health")
    return reply.json()  # type: ignore[no-any-return]


def resources() -> Op[dict[str, Any]]:
    """``GET /resources``."""
    reply = yield Request("GET", "/resources")
    return reply.json()  # type: ignore[no-any-return]


# --- sandbox lifecycle ----------------------------------------------------------------


def create_sandbox(
    image: str,
    *,
    prefix: str,
    block_network: bool = True,
    sandbox_id: str | None = None,
    chosen: bool = True,
    cpu: str | float | None = None,
    memory: str | None = None,
    timeout: float | None = 3600,
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    ttl: float | None = None,
) -> Op[SandboxInfo]:
    """Creates a sandbox (no wait); compatible route unless ``/v1``-only fields are given.

    The id is chosen by the SDK when the caller gave none (``chosen=False``), so a retry
    after a lost answer finds the sandbox (409) instead of making a second one.
    """
    if sandbox_id is None:
        sandbox_id, chosen = new_sandbox_id(prefix), False
    sid = sandbox_id
    cpu_s = None if cpu is None else str(cpu)
    if env or labels or ttl is not None:
        body = _clean(
            {
                "image": image,
                "id": sid,
                "block_network": block_network,
                "cpu": cpu_s,
                "memory": memory,
                "ready_timeout_s": None if timeout is None else int(timeout),
                "ttl_s": None if ttl is None else int(ttl),
                "env": dict(env) if env else None,
                "labels": dict(labels) if labels else None,
                "wait": False,
            }
        )
        path, get_path = "/v1/sandboxes", f"/v1/sandboxes/{_seg(sid)}"
    else:
        body = _clean(
            {
                "image": image,
                "sandbox_id": sid,
                "block_network": block_network,
                "cpu": cpu_s,
                "memory": memory,
                "timeout": None if timeout is None else int(timeout),
            }
        )
        path, get_path = "/sandboxes", f"/sandboxes/{_seg(sid)}"
    reply = yield Request("POST", path, json=body, idempotency=SAFE, ok=(409,))
    if reply.status == 409:
        if chosen or reply.attempts == 1:
            raise error_from_body(reply.status, reply.content)
        # Our own earlier attempt created it before its answer was lost.
        reply = yield Request("GET", get_path)
    return SandboxInfo.from_json(reply.json())


def wait_sandbox(sandbox_id: str, timeout: float | None, *, v1: bool = False) -> Op[SandboxInfo]:
    """Blocks (server-side, in chunks) until the sandbox is ready; 408 → timeout error.

    A sandbox no node can take yet (``status`` ``unschedulable``, on a Kubernetes
    server) is not an error: a node may join. The wait goes on, and prints
    ``[ID] Waiting for node... (Ns elapsed): MSG`` at most every
    :data:`NODE_REPORT_EVERY` seconds, as Orchard's SDK does; only ``failed`` (the
    server's readiness limit included) or ``timeout`` ends it.
    """
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    base = "/v1/sandboxes" if v1 else "/sandboxes"
    reported: float | None = None
    while True:
        remaining = NODE_REPORT_EVERY if deadline is None else deadline - time.monotonic()
        chunk = max(1, math.ceil(min(NODE_REPORT_EVERY, remaining)))
        reply = yield Request(
            "GET",
            f"{base}/{_seg(sandbox_id)}/wait",
            params={"timeout": chunk},
            timeout=chunk + WAIT_MARGIN,
            ok=(408,),
        )
        if reply.status != 408:
            return SandboxInfo.from_json(reply.json())
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise OrchardTimeoutError(
                f"sandbox {sandbox_id} not ready after {timeout:g}s", status=408, code="timeout"
            )
        if reported is not None and now - reported < NODE_REPORT_EVERY:
            continue
        info = yield from get_sandbox(sandbox_id, v1=v1)
        if info.status == "unschedulable":
            reported = now
            print(waiting_for_node(sandbox_id, now - started, info.status_message))


def waiting_for_node(sandbox_id: str, elapsed: float, message: str | None) -> str:
    """The line a wait prints while no node can take the sandbox (Orchard's words).

    >>> waiting_for_node("sb-1", 30.4, "0/1 nodes are available: 1 Insufficient cpu.")
    '[sb-1] Waiting for node... (30s elapsed): 0/1 nodes are available: 1 Insufficient cpu.'
    """
    return f"[{sandbox_id}] Waiting for node... ({int(elapsed)}s elapsed): {message or ''}"


def get_sandbox(sandbox_id: str, *, v1: bool = False) -> Op[SandboxInfo]:
    """``GET /sandboxes/{id}`` (or the ``/v1`` one, which also has the agent endpoint)."""
    base = "/v1/sandboxes" if v1 else "/sandboxes"
    reply = yield Request("GET", f"{base}/{_seg(sandbox_id)}")
    return SandboxInfo.from_json(reply.json())


def delete_sandbox(sandbox_id: str, *, missing_ok: bool = False) -> Op[bool]:
    """``DELETE /sandboxes/{id}``; True when deleted, False when it was already gone.

    A 404 after a retried attempt means the first attempt deleted it: not an error.
    """
    reply = yield Request("DELETE", f"/sandboxes/{_seg(sandbox_id)}", ok=(404,))
    if reply.status == 404:
        if missing_ok or reply.attempts > 1:
            return False
        raise error_from_body(reply.status, reply.content)
    return True


def heartbeat(sandbox_id: str) -> Op[dict[str, Any]]:
    """``POST /sandboxes/{id}/heartbeat``."""
    reply = yield Request("POST", f"/sandboxes/{_seg(sandbox_id)}/heartbeat", idempotency=SAFE)
    return reply.json()  # type: ignore[no-any-return]


def list_sandboxes() -> Op[list[SandboxInfo]]:
    """``GET /v1/sandboxes`` (the caller's own)."""
    reply = yield Request("GET", "/v1/sandboxes")
    return [SandboxInfo.from_json(s) for s in reply.json().get("sandboxes", [])]


# --- pause, snapshots and forks ---------------------------------------------------------


def snapshot_id_of(snapshot: Snapshot | str) -> str:
    """The id of a snapshot given as a :class:`Snapshot` or as its id."""
    return snapshot.snapshot_id if isinstance(snapshot, Snapshot) else str(snapshot)


def pause_sandbox(sandbox_id: str) -> Op[SandboxInfo]:
    """``POST /v1/sandboxes/{id}/pause`` (pausing a paused sandbox is harmless)."""
    reply = yield Request("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/pause", idempotency=SAFE)
    return SandboxInfo.from_json(reply.json())


def resume_sandbox(sandbox_id: str) -> Op[SandboxInfo]:
    """``POST /v1/sandboxes/{id}/resume`` (resuming a running sandbox is harmless)."""
    reply = yield Request("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/resume", idempotency=SAFE)
    return SandboxInfo.from_json(reply.json())


def take_snapshot(sandbox_id: str, labels: Mapping[str, str] | None) -> Op[Snapshot]:
    """``POST /v1/sandboxes/{id}/snapshots``.

    Safe to send again: snapshots are content-addressed, so a second capture of the
    same state is the same snapshot. Process checkpoints (``"processes": true``) are
    never asked for: no server here can take them (501).
    """
    body = {"labels": dict(labels) if labels else {}}
    reply = yield Request(
        "POST", f"/v1/sandboxes/{_seg(sandbox_id)}/snapshots", json=body, idempotency=SAFE
    )
    return Snapshot.from_json(reply.json())


def list_snapshots() -> Op[list[Snapshot]]:
    """``GET /v1/snapshots`` (the caller's, oldest first)."""
    reply = yield Request("GET", "/v1/snapshots")
    return [Snapshot.from_json(s) for s in reply.json().get("snapshots", [])]


def get_snapshot(snapshot_id: str) -> Op[Snapshot]:
    """``GET /v1/snapshots/{snapshot_id}``."""
    reply = yield Request("GET", f"/v1/snapshots/{_seg(snapshot_id)}")
    return Snapshot.from_json(reply.json())


def delete_snapshot(snapshot_id: str) -> Op[int]:
    """``DELETE /v1/snapshots/{snapshot_id}``; answers the bytes freed.

    409 while sandboxes forked from it exist. A 404 after a retried attempt means the
    first attempt deleted it: 0 bytes then.
    """
    reply = yield Request("DELETE", f"/v1/snapshots/{_seg(snapshot_id)}", ok=(404,))
    if reply.status == 404:
        if reply.attempts > 1:
            return 0
        raise error_from_body(reply.status, reply.content)
    return int(reply.json().get("freed_bytes", 0))


def fork_snapshot(
    snapshot_id: str,
    count: int,
    *,
    labels: Mapping[str, str] | None = None,
    ttl_s: float | None = None,
    ready_timeout_s: float | None = None,
) -> Op[list[SandboxInfo]]:
    """``POST /v1/snapshots/{snapshot_id}/fork``: ``count`` sandboxes, ready (the server
    waits for them, all or nothing).

    Never repeated once it may have reached the server: the forks' ids are the
    server's, so a second attempt would start ``count`` more.
    """
    body = _clean(
        {
            "count": count,
            "labels": dict(labels) if labels else None,
            "ttl_s": None if ttl_s is None else math.ceil(ttl_s),
            "ready_timeout_s": None if ready_timeout_s is None else math.ceil(ready_timeout_s),
            "wait": True,
        }
    )
    reply = yield Request(
        "POST", f"/v1/snapshots/{_seg(snapshot_id)}/fork", json=body, idempotency=UNSENT
    )
    return [SandboxInfo.from_json(s) for s in reply.json().get("sandboxes", [])]


# --- images ---------------------------------------------------------------------------


def list_images() -> Op[list[ImageInfo]]:
    """``GET /v1/images``."""
    reply = yield Request("GET", "/v1/images")
    return [ImageInfo.from_json(i) for i in reply.json().get("images", [])]


def import_image(name: str, content: Any, *, replayable: bool) -> Op[list[ImageInfo]]:
    """``POST /v1/images/import?name=REF`` with an archive body."""
    reply = yield Request(
        "POST",
        "/v1/images/import",
        params={"name": name},
        content=content,
        headers={"Content-Type": "application/x-tar"},
        idempotency=SAFE if replayable else UNSENT,
    )
    return [ImageInfo.from_json(i) for i in reply.json().get("images", [])]


def pull_image_request(reference: str) -> Request:
    """``POST /v1/images/pull`` (NDJSON progress stream)."""
    return Request("POST", "/v1/images/pull", json={"reference": reference}, idempotency=SAFE)


def delete_image(reference: str) -> Op[dict[str, Any]]:
    """``DELETE /v1/images?reference=REF``."""
    reply = yield Request("DELETE", "/v1/images", params={"reference": reference})
    return reply.json()  # type: ignore[no-any-return]


# --- compatible jobs, patches and files -------------------------------------------------


def submit_job(
    sandbox_id: str,
    command: Command,
    *,
    timeout: float | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    login_shell: bool = False,
) -> Op[str]:
    """``POST /sandboxes/{id}/exec`` with ``wait=false``; returns the job id.

    Never repeated once it may have reached the server: that could run it twice.
    """
    body = _clean(
        {
            "command": _command(command),
            "timeout_seconds": None if timeout is None else math.ceil(timeout),
            "cwd": cwd,
            "env": dict(env) if env else None,
            "login_shell": login_shell,
            "wait": False,
        }
    )
    reply = yield Request(
        "POST", f"/sandboxes/{_seg(sandbox_id)}/exec", json=body, idempotency=UNSENT
    )
    return str(reply.json()["job_id"])


def queued_job(job_id: str, sandbox_id: str, command: Command) -> JobResult:
    """What ``exec(wait=False)`` returns: the job just submitted, as Orchard's SDK builds it.

    >>> queued_job("j1", "sb", ["echo", "hi"]).status
    'queued'
    """
    return JobResult(
        {
            "job_id": job_id,
            "sandbox_id": sandbox_id,
            "command": command if isinstance(command, str) else list(command),
            "status": "queued",
            "created_at": time.time(),
        }
    )


def get_job(job_id: str) -> Op[JobResult]:
    """``GET /jobs/{job_id}``."""
    reply = yield Request("GET", f"/jobs/{_seg(job_id)}")
    return JobResult.from_json(reply.json())


def wait_job(job_id: str, timeout: float | None) -> Op[JobResult]:
    """Waits (server-side, in chunks) for a job to finish, at most ``timeout`` seconds.

    Returns the job as it is when the time is up, finished or not (``is_complete``).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        remaining = WAIT_CHUNK if deadline is None else deadline - time.monotonic()
        chunk = max(0, math.ceil(min(WAIT_CHUNK, remaining)))
        reply = yield Request(
            "GET",
            f"/jobs/{_seg(job_id)}/wait",
            params={"timeout": chunk},
            timeout=chunk + WAIT_MARGIN,
        )
        job = JobResult.from_json(reply.json())
        if job.is_complete or (deadline is not None and time.monotonic() >= deadline):
            return job


def exec_job(
    sandbox_id: str,
    command: Command,
    *,
    timeout: float | None,
    wait_limit: float | None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    login_shell: bool = False,
) -> Op[JobResult]:
    """Submits a job, then waits for it (the wait is safe to retry, the submit is not).

    A job still unfinished after ``wait_limit`` raises :class:`OrchardTimeoutError` (a
    ``TimeoutError``, as Orchard's SDK raises): ``exec`` never returns a running job as
    its result.
    """
    job_id = yield from submit_job(
        sandbox_id, command, timeout=timeout, cwd=cwd, env=env, login_shell=login_shell
    )
    job = yield from wait_job(job_id, wait_limit)
    if not job.is_complete:
        raise OrchardTimeoutError(
            f"job {job_id} did not complete within {wait_limit}s (status {job.status})",
            code="timeout",
        )
    return job


def apply_patch(sandbox_id: str, patch: str, timeout: float = 30) -> Op[PatchResult]:
    """``POST /sandboxes/{id}/apply_patch``."""
    reply = yield Request(
        "POST",
        f"/sandboxes/{_seg(sandbox_id)}/apply_patch",
        json={"patch": patch, "timeout_seconds": int(timeout)},
        idempotency=UNSENT,
        timeout=_read_timeout(timeout),
    )
    return reply.json()  # type: ignore[no-any-return]


def upload_content(sandbox_id: str, data: bytes, remote: str) -> Op[dict[str, Any]]:
    """``POST /sandboxes/{id}/files`` with the content in base64 (writing twice is harmless)."""
    body = {"path": remote, "content": base64.b64encode(data).decode()}
    reply = yield Request("POST", f"/sandboxes/{_seg(sandbox_id)}/files", json=body)
    return reply.json()  # type: ignore[no-any-return]


def download_content(sandbox_id: str, remote: str) -> Op[bytes]:
    """``GET /sandboxes/{id}/files?path=P``."""
    reply = yield Request("GET", f"/sandboxes/{_seg(sandbox_id)}/files", params={"path": remote})
    return base64.b64decode(reply.json().get("content", ""))


def list_files(sandbox_id: str, path: str) -> Op[list[FileEntry]]:
    """``GET /sandboxes/{id}/files/list?path=P``."""
    reply = yield Request("GET", f"/sandboxes/{_seg(sandbox_id)}/files/list", params={"path": path})
    return list(reply.json().get("files", []))


#: How a shell-string command starts on a terminal: under bash where the image has it
#: (Orchard sends ``["bash", "-c", command]``, so its users write bash: ``source``,
#: ``[[ ]]``), else under ``/bin/sh`` (busybox, alpine). ``$1`` is the command.
PTY_SHELL_PICK = 'command -v bash >/dev/null 2>&1 && exec bash -c "$1"; exec /bin/sh -c "$1"'


def pty_init_frame(
    command: Command | None,
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    rows: int,
    cols: int,
    login_shell: bool,
) -> dict[str, Any]:
    """First frame of the compatible PTY protocol."""
    cmd: list[str] | None
    if command is None:
        cmd = None
    elif isinstance(command, str):
        cmd = ["/bin/sh", "-c", PTY_SHELL_PICK, "sh", command]
    else:
        cmd = [str(c) for c in command]
    return _clean(
        {
            "type": "init",
            "cmd": cmd,
            "env": dict(env) if env else {},
            "cwd": cwd,
            "rows": rows,
            "cols": cols,
            "login_shell": login_shell,
        }
    )


def compat_pty_paths(sandbox_id: str) -> tuple[str, str]:
    """The compatible PTY WebSocket: the agent's own path, and the server's."""
    return "/v1/pty/compat", f"/sandboxes/{_seg(sandbox_id)}/exec/pty"


# --- /v1 agent routes -------------------------------------------------------------------


def server_agent_prefix(sandbox_id: str) -> str:
    """Where the server forwards a sandbox's agent routes (``agent=True`` requests)."""
    return f"/v1/sandboxes/{_seg(sandbox_id)}"


def exec_body(
    command: Command,
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | bytes | None = None,
    timeout: float | None = None,
    max_output_bytes: int | None = None,
    shell: str | None = None,
    kill_on_disconnect: bool | None = None,
) -> dict[str, Any]:
    """Body of ``/exec``, ``/exec/stream`` and ``/processes``."""
    return _clean(
        {
            "command": _command(command),
            "cwd": cwd,
            "env": dict(env) if env else None,
            "timeout_ms": _ms(timeout),
            "max_output_bytes": max_output_bytes,
            "shell": shell,
            "kill_on_disconnect": kill_on_disconnect,
            **_stdin_fields(stdin),
        }
    )


def run(body: dict[str, Any], timeout: float | None) -> Op[ExecResult]:
    """``POST /exec``: run and answer when it ends (never repeated once sent)."""
    reply = yield Request(
        "POST", "/exec", json=body, idempotency=UNSENT, agent=True, timeout=_read_timeout(timeout)
    )
    return ExecResult.from_json(reply.json())


def exec_stream_request(body: dict[str, Any]) -> Request:
    """``POST /exec/stream`` (NDJSON events; never repeated once sent)."""
    return Request("POST", "/exec/stream", json=body, idempotency=UNSENT, agent=True, timeout=None)


def agent_health() -> Op[dict[str, Any]]:
    """``GET /health`` of the agent."""
    reply = yield Request("GET", "/health", agent=True)
    return reply.json()  # type: ignore[no-any-return]


def start_process(body: dict[str, Any]) -> Op[ProcessInfo]:
    """``POST /processes``."""
    reply = yield Request("POST", "/processes", json=body, idempotency=UNSENT, agent=True)
    return ProcessInfo.from_json(reply.json())


def list_processes() -> Op[list[ProcessInfo]]:
    """``GET /processes``."""
    reply = yield Request("GET", "/processes", agent=True)
    return [ProcessInfo.from_json(p) for p in reply.json().get("processes", [])]


def get_process(pid: str) -> Op[ProcessInfo]:
    """``GET /processes/{id}``."""
    reply = yield Request("GET", f"/processes/{_seg(pid)}", agent=True)
    return ProcessInfo.from_json(reply.json())


def process_output(
    pid: str, stdout_offset: int = 0, stderr_offset: int = 0, max_bytes: int | None = None
) -> Op[ProcessOutput]:
    """``GET /processes/{id}/output``."""
    reply = yield Request(
        "GET",
        f"/processes/{_seg(pid)}/output",
        params={
            "stdout_offset": stdout_offset,
            "stderr_offset": stderr_offset,
            "max_bytes": max_bytes,
        },
        agent=True,
    )
    return ProcessOutput.from_json(reply.json())


def process_stdin(pid: str, data: str | bytes | None, eof: bool) -> Op[ProcessInfo]:
    """``POST /processes/{id}/stdin``."""
    body: dict[str, Any] = {"eof": eof}
    if isinstance(data, bytes):
        body["data_b64"] = base64.b64encode(data).decode()
    elif data is not None:
        body["data"] = data
    reply = yield Request(
        "POST", f"/processes/{_seg(pid)}/stdin", json=body, idempotency=UNSENT, agent=True
    )
    return ProcessInfo.from_json(reply.json())


def process_signal(pid: str, signal: str | int, group: bool) -> Op[ProcessInfo]:
    """``POST /processes/{id}/signal``."""
    reply = yield Request(
        "POST",
        f"/processes/{_seg(pid)}/signal",
        json={"signal": signal, "group": group},
        idempotency=UNSENT,
        agent=True,
    )
    return ProcessInfo.from_json(reply.json())


def process_wait(pid: str, timeout: float | None) -> Op[ProcessInfo]:
    """Waits (server-side, in chunks) for a background process; answers it as it is then."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        remaining = WAIT_CHUNK if deadline is None else deadline - time.monotonic()
        chunk = max(0.0, min(WAIT_CHUNK, remaining))
        reply = yield Request(
            "GET",
            f"/processes/{_seg(pid)}/wait",
            params={"timeout_ms": int(chunk * 1000)},
            agent=True,
            timeout=chunk + WAIT_MARGIN,
        )
        info = ProcessInfo.from_json(reply.json())
        if not info.running or (deadline is not None and time.monotonic() >= deadline):
            return info


def delete_process(pid: str) -> Op[ProcessInfo | None]:
    """``DELETE /processes/{id}``: kill it if running and forget it."""
    reply = yield Request("DELETE", f"/processes/{_seg(pid)}", agent=True, ok=(404,))
    if reply.status == 404:
        if reply.attempts > 1:
            return None
        raise error_from_body(reply.status, reply.content)
    return ProcessInfo.from_json(reply.json())


def create_session(
    cwd: str | None, env: Mapping[str, str] | None, shell: str | None
) -> Op[SessionInfo]:
    """``POST /sessions``."""
    body = _clean({"cwd": cwd, "env": dict(env) if env else None, "shell": shell})
    reply = yield Request("POST", "/sessions", json=body, idempotency=UNSENT, agent=True)
    return SessionInfo.from_json(reply.json())


def list_sessions() -> Op[list[SessionInfo]]:
    """``GET /sessions``."""
    reply = yield Request("GET", "/sessions", agent=True)
    return [SessionInfo.from_json(s) for s in reply.json().get("sessions", [])]


def get_session(sid: str) -> Op[SessionInfo]:
    """``GET /sessions/{id}``."""
    reply = yield Request("GET", f"/sessions/{_seg(sid)}", agent=True)
    return SessionInfo.from_json(reply.json())


def session_run(sid: str, command: str, timeout: float | None) -> Op[SessionResult]:
    """``POST /sessions/{id}/run``."""
    reply = yield Request(
        "POST",
        f"/sessions/{_seg(sid)}/run",
        json=_clean({"command": command, "timeout_ms": _ms(timeout)}),
        idempotency=UNSENT,
        agent=True,
        timeout=_read_timeout(timeout),
    )
    return SessionResult.from_json(reply.json())


def delete_session(sid: str, *, missing_ok: bool = False) -> Op[None]:
    """``DELETE /sessions/{id}``."""
    reply = yield Request("DELETE", f"/sessions/{_seg(sid)}", agent=True, ok=(404,))
    if reply.status == 404 and not (missing_ok or reply.attempts > 1):
        raise error_from_body(reply.status, reply.content)
    return None


def create_pty(
    command: Command | None,
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    rows: int | None,
    cols: int | None,
    login_shell: bool,
    idle_timeout: float | None,
) -> Op[PtyInfo]:
    """``POST /pty``."""
    body = _clean(
        {
            "command": None if command is None else _command(command),
            "cwd": cwd,
            "env": dict(env) if env else None,
            "rows": rows,
            "cols": cols,
            "login_shell": login_shell or None,
            "idle_timeout_ms": _ms(idle_timeout),
        }
    )
    reply = yield Request("POST", "/pty", json=body, idempotency=UNSENT, agent=True)
    return PtyInfo.from_json(reply.json())


def pty_attach_paths(sandbox_id: str, pty_id: str) -> tuple[str, str]:
    """A ``/v1`` terminal's attach WebSocket: the agent's own path, and the server's."""
    path = f"/pty/{_seg(pty_id)}/attach"
    return "/v1" + path, server_agent_prefix(sandbox_id) + path


def list_ptys() -> Op[list[PtyInfo]]:
    """``GET /pty``."""
    reply = yield Request("GET", "/pty", agent=True)
    return [PtyInfo.from_json(p) for p in reply.json().get("ptys", [])]


def get_pty(tid: str) -> Op[PtyInfo]:
    """``GET /pty/{id}``."""
    reply = yield Request("GET", f"/pty/{_seg(tid)}", agent=True)
    return PtyInfo.from_json(reply.json())


def resize_pty(tid: str, rows: int, cols: int) -> Op[PtyInfo]:
    """``POST /pty/{id}/resize`` (setting the same size twice is harmless)."""
    reply = yield Request(
        "POST", f"/pty/{_seg(tid)}/resize", json={"rows": rows, "cols": cols}, agent=True
    )
    return PtyInfo.from_json(reply.json())


def delete_pty(tid: str, *, missing_ok: bool = False) -> Op[None]:
    """``DELETE /pty/{id}``."""
    reply = yield Request("DELETE", f"/pty/{_seg(tid)}", agent=True, ok=(404,))
    if reply.status == 404 and not (missing_ok or reply.attempts > 1):
        raise error_from_body(reply.status, reply.content)
    return None


def write_file(
    path: str, content: Any, *, replayable: bool, mode: int | str | None, parents: bool
) -> Op[int]:
    """``PUT /files?path=P`` with the raw (possibly streamed) body; returns the size."""
    mode_s = None if mode is None else (format(mode, "o") if isinstance(mode, int) else mode)
    reply = yield Request(
        "PUT",
        "/files",
        params={"path": path, "mode": mode_s, "parents": parents},
        content=content,
        headers={"Content-Type": "application/octet-stream"},
        idempotency=SAFE if replayable else UNSENT,
        agent=True,
    )
    return int(reply.json().get("size", 0))


def read_file_request(path: str, offset: int | None = None, length: int | None = None) -> Request:
    """``GET /files?path=P`` (raw bytes, streamed)."""
    return Request(
        "GET", "/files", params={"path": path, "offset": offset, "length": length}, agent=True
    )


def read_file(path: str, offset: int | None = None, length: int | None = None) -> Op[bytes]:
    """``GET /files?path=P``, whole."""
    reply = yield read_file_request(path, offset, length)
    return reply.content


def stat(path: str) -> Op[FileStat]:
    """``GET /files/stat``."""
    reply = yield Request("GET", "/files/stat", params={"path": path}, agent=True)
    return FileStat.from_json(reply.json())


def list_dir(path: str, depth: int = 1) -> Op[list[FileStat]]:
    """``GET /files/list``."""
    reply = yield Request("GET", "/files/list", params={"path": path, "depth": depth}, agent=True)
    return [FileStat.from_json(e) for e in reply.json().get("entries", [])]


def mkdir(path: str, mode: int | None = None) -> Op[None]:
    """``POST /files/mkdir`` (with parents; repeating it is harmless)."""
    yield Request("POST", "/files/mkdir", json=_clean({"path": path, "mode": mode}), agent=True)
    return None


def move(src: str, dst: str, overwrite: bool = False) -> Op[None]:
    """``POST /files/move``."""
    yield Request(
        "POST",
        "/files/move",
        json={"from": src, "to": dst, "overwrite": overwrite},
        idempotency=UNSENT,
        agent=True,
    )
    return None


def remove(path: str, recursive: bool = False) -> Op[None]:
    """``DELETE /files?path=P``; a 404 after a retry means the first attempt removed it."""
    reply = yield Request(
        "DELETE",
        "/files",
        params={"path": path, "recursive": recursive},
        agent=True,
        ok=(404,),
    )
    if reply.status == 404 and reply.attempts == 1:
        raise error_from_body(reply.status, reply.content)
    return None


def upload_tar(remote_dir: str, content: Any, *, replayable: bool) -> Op[ExtractResult]:
    """``PUT /files/archive?path=DIR`` with a tar or tar.gz body."""
    reply = yield Request(
        "PUT",
        "/files/archive",
        params={"path": remote_dir},
        content=content,
        headers={"Content-Type": "application/x-tar"},
        idempotency=SAFE if replayable else UNSENT,
        agent=True,
    )
    return ExtractResult.from_json(reply.json())


def download_tar_request(path: str) -> Request:
    """``GET /files/archive?path=P`` (tar.gz, streamed)."""
    return Request("GET", "/files/archive", params={"path": path}, agent=True)


def git_status(repo: str) -> Op[GitStatus]:
    """``POST /git/status``."""
    reply = yield Request("POST", "/git/status", json={"repo": repo}, agent=True)
    return GitStatus.from_json(reply.json())


def git_diff(repo: str, base: str | None, include_untracked: bool, binary: bool) -> Op[GitDiff]:
    """``POST /git/diff``."""
    body = _clean(
        {"repo": repo, "base": base, "include_untracked": include_untracked, "binary": binary}
    )
    reply = yield Request("POST", "/git/diff", json=body, agent=True)
    return GitDiff.from_json(reply.json())


def git_apply(repo: str, patch: str, check_only: bool, fuzzy: bool) -> Op[GitApplyResult]:
    """``POST /git/apply`` (all or nothing; never repeated once sent)."""
    body = {"repo": repo, "patch": patch, "check_only": check_only, "fuzzy": fuzzy}
    reply = yield Request(
        "POST",
        "/git/apply",
        json=body,
        idempotency=SAFE if check_only else UNSENT,
        agent=True,
    )
    return GitApplyResult.from_json(reply.json())


def git_commit(
    repo: str,
    message: str,
    author_name: str | None,
    author_email: str | None,
    allow_empty: bool,
) -> Op[GitCommitResult]:
    """``POST /git/commit`` (never repeated once sent)."""
    body = _clean(
        {
            "repo": repo,
            "message": message,
            "author_name": author_name,
            "author_email": author_email,
            "allow_empty": allow_empty,
        }
    )
    reply = yield Request("POST", "/git/commit", json=body, idempotency=UNSENT, agent=True)
    return GitCommitResult.from_json(reply.json())


def git_reset(
    repo: str, target: str | None, clean_untracked: bool, keep_ignored: bool
) -> Op[GitResetResult]:
    """``POST /git/reset`` (resetting to the same target twice is harmless)."""
    body = _clean(
        {
            "repo": repo,
            "target": target,
            "clean_untracked": clean_untracked,
            "keep_ignored": keep_ignored,
        }
    )
    reply = yield Request("POST", "/git/reset", json=body, agent=True)
    return GitResetResult.from_json(reply.json())

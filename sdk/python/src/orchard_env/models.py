"""The values the SDK returns: plain dataclasses built from the server's JSON.

Each keeps the JSON it was built from in ``raw``, so fields the server adds later are
reachable before the SDK knows them.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
from dataclasses import dataclass, field
from typing import Any, Literal, Self, TypedDict, TypeVar

__all__ = [
    "AgentEndpoint",
    "SandboxInfo",
    "JobResult",
    "ExecResult",
    "ExecStart",
    "ExecOutput",
    "ExecExit",
    "ExecEvent",
    "ExitInfo",
    "ProcessInfo",
    "ProcessOutput",
    "SessionInfo",
    "SessionResult",
    "PtyInfo",
    "FileStat",
    "FileEntry",
    "ExtractResult",
    "GitStatusEntry",
    "GitStatus",
    "GitDiff",
    "GitConflict",
    "GitApplyResult",
    "GitCommitResult",
    "GitResetResult",
    "ImageInfo",
    "PatchResult",
    "SessionState",
    "Snapshot",
]

_T = TypeVar("_T")


def _pick(cls: type[_T], data: dict[str, Any], **overrides: Any) -> _T:
    """Builds dataclass ``cls`` from the keys of ``data`` that are fields of it."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in overrides:
            kwargs[f.name] = overrides[f.name]
        elif f.name == "raw":
            kwargs["raw"] = data
        elif f.name in data:
            kwargs[f.name] = data[f.name]
    return cls(**kwargs)


class _AgentJson:
    """A value the agent answers as a JSON object of the same name, field for field."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """Builds it from the agent's JSON object of the same name (``PtyInfo`` for
        :class:`PtyInfo`...), keeping the keys that are its fields."""
        return _pick(cls, data)


class _TextStreams:
    """A command's two streams as text, from the bytes a result holds."""

    stdout_bytes: bytes
    stderr_bytes: bytes

    @property
    def stdout(self) -> str:
        """Standard output as text."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """Standard error as text."""
        return self.stderr_bytes.decode("utf-8", "replace")


def decode_output(output: dict[str, Any] | str | None) -> bytes:
    """The bytes of an agent ``Output`` (``{"data", "encoding": "utf8" | "base64"}``)."""
    if output is None:
        return b""
    if isinstance(output, str):
        return output.encode()
    data = output.get("data", "")
    if output.get("encoding") == "base64":
        return base64.b64decode(data)
    return str(data).encode()


@dataclass
class AgentEndpoint:
    """Where a sandbox's own agent listens, and the token it wants (``x-orchard-token``)."""

    token: str
    socket: str | None = None
    url: str | None = None

    def __repr__(self) -> str:  # never print the token
        return f"AgentEndpoint(socket={self.socket!r}, url={self.url!r}, token=...)"


@dataclass
class SandboxInfo:
    """A sandbox as the server describes it (compatible or ``/v1`` shape).

    ``status`` is ``"pending"``, ``"unschedulable"`` (still pending: no node can take it
    yet, ``status_message`` gives the scheduler's reason), ``"ready"`` (``"running"`` on
    ``/v1``), ``"paused"`` (``/v1`` only) or ``"failed"`` (``status_message`` says
    why); ``agent`` is set only by ``/v1`` answers once the sandbox is ready.
    ``paused`` is true while the sandbox is frozen
    (:meth:`~orchard_env.SandboxInstance.pause`); only ``/v1`` answers report it, the
    compatible routes' never do.
    """

    sandbox_id: str
    image: str | None = None
    status: str | None = None
    ready: bool = False
    status_message: str | None = None
    #: ISO-8601 on ``/v1``; Unix epoch seconds (a float) on the compatible routes.
    created_at: str | float | None = None
    block_network: bool | None = None
    cpu: str | None = None
    memory: str | None = None
    namespace: str | None = None
    pod_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    expires_at: str | None = None
    agent: AgentEndpoint | None = None
    paused: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxInfo:
        """Builds it from either API's JSON."""
        agent = data.get("agent")
        endpoint = None
        if isinstance(agent, dict) and agent.get("token"):
            endpoint = AgentEndpoint(
                token=agent["token"], socket=agent.get("socket"), url=agent.get("url")
            )
        cpu = data.get("cpu")
        memory = data.get("memory")
        return _pick(
            cls,
            data,
            sandbox_id=data.get("sandbox_id") or data.get("id") or "",
            agent=endpoint,
            labels=data.get("labels") or {},
            ready=bool(data.get("ready", data.get("status") == "running")),
            cpu=None if cpu is None else str(cpu),
            memory=None if memory is None else str(memory),
            paused=bool(data.get("paused", False)),
        )


def epoch_seconds(value: Any) -> float | None:
    """A timestamp as Unix epoch seconds: floats pass, ISO-8601 strings are converted.

    The compatible routes send floats (as Orchard does); servers before that change
    sent ISO-8601 strings, which are still accepted.

    >>> epoch_seconds(1702900000.25), epoch_seconds("2023-12-18T11:46:40.25Z")
    (1702900000.25, 1702900000.25)
    >>> epoch_seconds(None) is None, epoch_seconds("garbage") is None
    (True, True)
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            parsed = datetime.datetime.fromisoformat(text)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.UTC)
        return parsed.timestamp()
    return None


class JobResult:
    """A command run through the compatible jobs API (:meth:`SandboxInstance.exec`).

    Built as Orchard's is, from the job object: ``JobResult(data)``. ``status`` goes
    ``queued`` → ``running`` → ``succeeded`` (exit 0) or ``failed`` (non-zero exit, or
    ``error`` set when the command could not run or timed out). ``created_at``,
    ``started_at`` and ``completed_at`` are Unix epoch seconds (floats, ``None`` when
    not known yet).

    >>> r = sandbox.exec("echo hi; exit 3")
    >>> (r.stdout, r.exit_code, r.succeeded, r.failed, r.is_complete)
    ('hi\\n', 3, False, True, True)
    >>> JobResult({"job_id": "j", "status": "running", "created_at": 5}).created_at
    5.0
    """

    job_id: str
    sandbox_id: str | None
    command: Any
    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    error: str | None
    created_at: float | None
    started_at: float | None
    completed_at: float | None
    #: The job object it was built from.
    raw: dict[str, Any]

    def __init__(self, data: dict[str, Any]) -> None:
        self.raw = data
        self.job_id = str(data.get("job_id", ""))
        self.sandbox_id = data.get("sandbox_id")
        self.command = data.get("command")
        self.status = str(data.get("status", "queued"))
        self.stdout = data.get("stdout") or ""
        self.stderr = data.get("stderr") or ""
        self.exit_code = data.get("exit_code")
        self.error = data.get("error")
        self.created_at = epoch_seconds(data.get("created_at"))
        self.started_at = epoch_seconds(data.get("started_at"))
        self.completed_at = epoch_seconds(data.get("completed_at"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobResult:
        """Builds it from the job object (the same as ``JobResult(data)``)."""
        return cls(data)

    @property
    def succeeded(self) -> bool:
        """True when the command ran and exited 0."""
        return self.status == "succeeded"

    @property
    def failed(self) -> bool:
        """True when the command exited non-zero, or could not run, or timed out."""
        return self.status == "failed"

    @property
    def is_complete(self) -> bool:
        """True once the job has finished (succeeded or failed); never while queued or running."""
        return self.status in ("succeeded", "failed")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobResult) and other.raw == self.raw

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"JobResult(job_id={self.job_id!r}, status={self.status!r}, "
            f"exit_code={self.exit_code!r})"
        )


@dataclass
class ExecResult(_TextStreams):
    """A command run through ``/v1`` (:meth:`SandboxInstance.run`), with both streams.

    ``stdout``/``stderr`` are text (invalid UTF-8 replaced); the exact bytes are in
    ``stdout_bytes``/``stderr_bytes``. Past the output cap the middle is dropped and
    ``stdout_truncated`` is set; ``stdout_total`` counts every byte written.

    >>> r = sandbox.run(["sh", "-c", "echo out; echo err >&2; exit 2"])
    >>> (r.stdout, r.stderr, r.exit_code, r.ok)
    ('out\\n', 'err\\n', 2, False)
    """

    exit_code: int | None
    signal: int | None
    timed_out: bool
    duration_ms: float
    pid: int | None
    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_total: int = 0
    stderr_total: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecResult:
        """Builds it from the agent's ``ExecResult``."""
        out = data.get("stdout") or {}
        err = data.get("stderr") or {}
        return cls(
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            timed_out=bool(data.get("timed_out", False)),
            duration_ms=float(data.get("duration_ms", 0.0)),
            pid=data.get("pid"),
            stdout_bytes=decode_output(out),
            stderr_bytes=decode_output(err),
            stdout_truncated=bool(out.get("truncated", False)) if isinstance(out, dict) else False,
            stderr_truncated=bool(err.get("truncated", False)) if isinstance(err, dict) else False,
            stdout_total=int(out.get("total_bytes", 0)) if isinstance(out, dict) else 0,
            stderr_total=int(err.get("total_bytes", 0)) if isinstance(err, dict) else 0,
            raw=data,
        )

    @property
    def ok(self) -> bool:
        """True when the command exited 0 in time."""
        return self.exit_code == 0 and not self.timed_out


@dataclass
class ExecStart:
    """First event of a streamed exec: the process started with ``pid``."""

    pid: int


@dataclass
class ExecOutput:
    """Bytes the process wrote on ``stream`` (``"stdout"`` or ``"stderr"``)."""

    stream: Literal["stdout", "stderr"]
    data: bytes

    @property
    def text(self) -> str:
        """The bytes as text (a chunk may end inside a multi-byte character)."""
        return self.data.decode("utf-8", "replace")


@dataclass
class ExecExit:
    """Last event of a streamed exec: how the process ended."""

    exit_code: int | None
    signal: int | None = None
    timed_out: bool = False
    duration_ms: float = 0.0
    stdout_bytes: int = 0
    stderr_bytes: int = 0


#: One event of :meth:`SandboxInstance.exec_stream`.
ExecEvent = ExecStart | ExecOutput | ExecExit


@dataclass
class ExitInfo:
    """How a background process ended."""

    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    duration_ms: float = 0.0


@dataclass
class ProcessInfo:
    """A background process (:meth:`SandboxInstance.start_process`)."""

    id: str
    pid: int
    argv: list[str]
    state: str
    started_at_ms: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdin_open: bool = False
    exit: ExitInfo | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessInfo:
        """Builds it from the agent's ``ProcessInfo``."""
        exit_ = data.get("exit")
        return _pick(cls, data, exit=_pick(ExitInfo, exit_) if isinstance(exit_, dict) else None)

    @property
    def running(self) -> bool:
        """True while the process runs."""
        return self.state == "running"

    @property
    def exit_code(self) -> int | None:
        """Its exit code once it exited normally."""
        return self.exit.exit_code if self.exit else None


@dataclass
class ProcessOutput:
    """Output of a background process after the asked offsets.

    ``*_next_offset`` is where the next read starts; ``*_lost`` counts bytes the ring
    buffer had already dropped.
    """

    stdout: bytes
    stderr: bytes
    stdout_next_offset: int
    stderr_next_offset: int
    stdout_lost: int
    stderr_lost: int
    process: ProcessInfo

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessOutput:
        """Builds it from the agent's ``ProcessOutput``."""
        out = data.get("stdout") or {}
        err = data.get("stderr") or {}
        return cls(
            stdout=base64.b64decode(out.get("data", "")),
            stderr=base64.b64decode(err.get("data", "")),
            stdout_next_offset=int(out.get("next_offset", 0)),
            stderr_next_offset=int(err.get("next_offset", 0)),
            stdout_lost=int(out.get("lost_bytes", 0)),
            stderr_lost=int(err.get("lost_bytes", 0)),
            process=ProcessInfo.from_json(data.get("process") or {}),
        )


@dataclass
class SessionInfo(_AgentJson):
    """A persistent shell session."""

    id: str
    pid: int
    shell: str
    alive: bool
    commands: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class SessionResult(_TextStreams):
    """A command run in a session: its ``$?``, both streams, and whether the shell lives."""

    exit_code: int | None
    timed_out: bool
    duration_ms: float
    session_alive: bool
    stdout_bytes: bytes
    stderr_bytes: bytes
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionResult:
        """Builds it from the agent's ``SessionRunResult``."""
        return cls(
            exit_code=data.get("exit_code"),
            timed_out=bool(data.get("timed_out", False)),
            duration_ms=float(data.get("duration_ms", 0.0)),
            session_alive=bool(data.get("session_alive", True)),
            stdout_bytes=decode_output(data.get("stdout")),
            stderr_bytes=decode_output(data.get("stderr")),
            raw=data,
        )


@dataclass
class PtyInfo(_AgentJson):
    """A terminal of the ``/v1`` PTY API."""

    id: str
    pid: int
    argv: list[str]
    rows: int
    cols: int
    alive: bool
    viewers: int = 0
    exit_code: int | None = None
    signal: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class FileStat(_AgentJson):
    """Metadata of a path in a sandbox (``kind``: file, directory, symlink or other)."""

    path: str
    name: str
    kind: str
    size: int
    mode: int
    modified_ms: int
    link_target: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_dir(self) -> bool:
        """True for a directory."""
        return self.kind == "directory"

    @property
    def is_file(self) -> bool:
        """True for a regular file."""
        return self.kind == "file"


class FileEntry(TypedDict):
    """One entry of :meth:`SandboxInstance.list_files` (the compatible listing)."""

    name: str
    type: str
    size: int
    modified: str


class PatchResult(TypedDict):
    """Answer of :meth:`SandboxInstance.apply_patch`."""

    success: bool
    stdout: str
    stderr: str
    exit_code: int | None
    error: str | None


@dataclass
class ExtractResult(_AgentJson):
    """Answer of a tar upload: the target directory, entries and bytes extracted."""

    path: str
    entries: int
    bytes: int


@dataclass
class GitStatusEntry:
    """One changed path of :class:`GitStatus`."""

    path: str
    status: str
    staged: bool
    old_path: str | None = None


@dataclass
class GitStatus:
    """Branch, HEAD and changed paths of a repository."""

    clean: bool
    entries: list[GitStatusEntry]
    branch: str | None = None
    head: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GitStatus:
        """Builds it from the agent's ``GitStatus``."""
        entries = [_pick(GitStatusEntry, e) for e in data.get("entries", [])]
        return _pick(cls, data, entries=entries)


@dataclass
class GitDiff(_AgentJson):
    """The work tree against a base, as a patch ``git apply`` accepts."""

    patch: str
    files_changed: int = 0
    insertions: int = 0
    deletions: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class GitConflict:
    """A file or hunk of a patch that does not apply."""

    path: str
    reason: str
    hunk: int | None = None
    header: str | None = None


@dataclass
class GitApplyResult:
    """Whether a patch applied (all or nothing) and, if not, why."""

    applied: bool
    files: list[str]
    conflicts: list[GitConflict]
    fuzzed: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GitApplyResult:
        """Builds it from the agent's ``GitApplyResult``."""
        conflicts = [_pick(GitConflict, c) for c in data.get("conflicts", [])]
        return _pick(cls, data, conflicts=conflicts, fuzzed=data.get("fuzzed") or [])


@dataclass
class GitCommitResult(_AgentJson):
    """The new commit (now HEAD) and how many files it changed."""

    commit: str
    files_changed: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class GitResetResult(_AgentJson):
    """HEAD after a hard reset, and the untracked paths removed."""

    removed: list[str]
    head: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ImageInfo:
    """An image in the server's store."""

    reference: str
    digest: str | None = None
    layers: int | None = None
    size_bytes: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImageInfo:
        """Builds it from the server's image JSON."""
        layers = data.get("layers")
        if isinstance(layers, list):
            layers = len(layers)
        return _pick(cls, data, layers=layers)


@dataclass
class SessionState:
    """A shell session as a snapshot keeps it, and as its forks get it back: the same
    ``id``, ``shell``, working directory (``cwd``), exported variables (``env``) and
    shell ``functions`` (text that defines them again; empty for shells that cannot
    list them, such as busybox ``sh``)."""

    id: str
    shell: str = ""
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    functions: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionState:
        """Builds it from the server's ``SessionState``."""
        return _pick(cls, data, env=data.get("env") or {})


@dataclass
class Snapshot:
    """An immutable, content-addressed snapshot of a sandbox
    (:meth:`~orchard_env.SandboxInstance.snapshot`).

    It holds the sandbox's filesystem changes (``layers`` on top of ``image``, bottom
    first; ``size_bytes`` its own layer, ``total_bytes`` its parents' too) and its
    environment: the image, environment variables, CPU, memory and network, and the
    state of each shell session (``sessions``). Running processes are not captured
    (``processes`` is always ``"none"``): there is no process checkpointing (CRIU does
    not work on the servers' kernel), so forks start with no process but their agent
    and their restored sessions. ``sandbox_id`` is the sandbox it was taken of (which
    may be gone since), ``parent_snapshot_id`` the snapshot that sandbox was forked
    from, ``forks`` the sandboxes forked from it that still exist (it cannot be deleted
    while there are any), ``frozen_ms`` how long the sandbox was frozen for the
    capture. ``created_at`` is ISO-8601 UTC.

    >>> s = Snapshot.from_json({"snapshot_id": "snap-1", "sessions": [{"id": "s1", "cwd": "/"}]})
    >>> s.id, s.sessions[0].cwd, s.processes
    ('snap-1', '/', 'none')
    """

    snapshot_id: str
    digest: str = ""
    sandbox_id: str = ""
    parent_snapshot_id: str | None = None
    image: str = ""
    created_at: str | None = None
    size_bytes: int = 0
    total_bytes: int = 0
    tmp_bytes: int = 0
    layers: list[str] = field(default_factory=list)
    sessions: list[SessionState] = field(default_factory=list)
    processes: str = "none"
    labels: dict[str, str] = field(default_factory=dict)
    forks: list[str] = field(default_factory=list)
    frozen_ms: float = 0.0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Snapshot:
        """Builds it from the server's ``Snapshot``."""
        return _pick(
            cls,
            data,
            sessions=[SessionState.from_json(s) for s in data.get("sessions") or []],
            labels=data.get("labels") or {},
            layers=data.get("layers") or [],
            forks=data.get("forks") or [],
            processes=data.get("processes") or "none",
        )

    @property
    def id(self) -> str:
        """Alias of :attr:`snapshot_id`."""
        return self.snapshot_id

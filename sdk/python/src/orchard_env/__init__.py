"""Orchard Env's Python SDK: sandboxes for agentic-model research.

:class:`SandboxClient` (and :class:`AsyncSandboxClient`) talk to an ``orchard serve``
server: they create :class:`SandboxInstance` objects (:class:`AsyncSandboxInstance`),
which run commands (:meth:`~SandboxInstance.exec` returns a :class:`JobResult`;
:meth:`~SandboxInstance.run` an :class:`ExecResult`; :meth:`~SandboxInstance.exec_stream`
yields events), move files, drive terminals (:class:`ContainerProcess`), background
processes (:class:`Process`), shell sessions (:class:`Session`) and git, and pause,
snapshot (:class:`Snapshot`) and fork them (:meth:`~SandboxClient.fork`). Errors are
:class:`OrchardError` subclasses. Configuration comes from ``SANDBOX_BASE_URL``,
``SANDBOX_API_KEY`` and ``SANDBOX_PREFIX``.

>>> from orchard_env import SandboxClient
>>> with SandboxClient() as client:
...     with client.create_sandbox("busybox:latest") as sandbox:
...         sandbox.exec("echo 'Hello, Orchard!'").stdout
'Hello, Orchard!\\n'
"""

from ._retry import RetryPolicy
from ._sync import ExecStream, Process, SandboxClient, SandboxInstance, Session, Terminal
from .aio import (
    AsyncExecStream,
    AsyncProcess,
    AsyncSandboxClient,
    AsyncSandboxInstance,
    AsyncSession,
    AsyncTerminal,
    SandboxCreation,
)
from .errors import (
    APIError,
    AuthError,
    BadRequestError,
    BodyTooLargeError,
    ConflictError,
    NotFoundError,
    NotImplementedByServerError,
    OrchardConnectionError,
    OrchardError,
    OrchardTimeoutError,
    PermissionDeniedError,
    QuotaError,
    RequestTimeoutError,
    SandboxDeletedError,
    SandboxError,
    ServerError,
    TerminalError,
    UnavailableError,
    UnprocessableError,
)
from .models import (
    AgentEndpoint,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecResult,
    ExecStart,
    ExitInfo,
    ExtractResult,
    FileEntry,
    FileStat,
    GitApplyResult,
    GitCommitResult,
    GitConflict,
    GitDiff,
    GitResetResult,
    GitStatus,
    GitStatusEntry,
    ImageInfo,
    JobResult,
    PatchResult,
    ProcessInfo,
    ProcessOutput,
    PtyInfo,
    SandboxInfo,
    SessionInfo,
    SessionResult,
    SessionState,
    Snapshot,
)
from .pty import AsyncContainerProcess, ContainerProcess

#: Orchard's alias of :class:`SandboxClient`.
Sandbox = SandboxClient
#: Orchard's alias of :class:`AsyncSandboxClient`.
AsyncSandbox = AsyncSandboxClient

__version__ = "0.1.0"

__all__ = [
    "SandboxClient",
    "AsyncSandboxClient",
    "Sandbox",
    "AsyncSandbox",
    "SandboxInstance",
    "AsyncSandboxInstance",
    "SandboxCreation",
    "JobResult",
    "ExecResult",
    "ExecStream",
    "AsyncExecStream",
    "ExecEvent",
    "ExecStart",
    "ExecOutput",
    "ExecExit",
    "ContainerProcess",
    "AsyncContainerProcess",
    "Process",
    "AsyncProcess",
    "Session",
    "AsyncSession",
    "Terminal",
    "AsyncTerminal",
    "RetryPolicy",
    "AgentEndpoint",
    "SandboxInfo",
    "ExitInfo",
    "ProcessInfo",
    "ProcessOutput",
    "SessionInfo",
    "SessionResult",
    "PtyInfo",
    "FileStat",
    "FileEntry",
    "PatchResult",
    "ExtractResult",
    "GitStatus",
    "GitStatusEntry",
    "GitDiff",
    "GitConflict",
    "GitApplyResult",
    "GitCommitResult",
    "GitResetResult",
    "ImageInfo",
    "Snapshot",
    "SessionState",
    "OrchardError",
    "APIError",
    "BadRequestError",
    "AuthError",
    "NotFoundError",
    "ConflictError",
    "OrchardTimeoutError",
    "QuotaError",
    "SandboxError",
    "ServerError",
    "UnavailableError",
    "NotImplementedByServerError",
    "OrchardConnectionError",
    "RequestTimeoutError",
    "SandboxDeletedError",
    "TerminalError",
    "BodyTooLargeError",
    "UnprocessableError",
    "PermissionDeniedError",
]

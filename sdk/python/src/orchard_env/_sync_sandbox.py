# generated from _aio_sandbox.py by scripts/unasync.py; do not edit
"""One sandbox, :class:`SandboxInstance`: its lifecycle (wait, refresh, heartbeats,
delete), pause, resume and snapshot. Its other methods come from the classes it is made
of: :class:`SandboxJobs` (the compatible API), :class:`SandboxExec`,
:class:`SandboxSessions`, :class:`SandboxFiles` and :class:`SandboxGit`
(the ``/v1`` agent API)."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

from . import _ops
from ._base import describe
from ._sync_exec import SandboxExec
from ._sync_files import SandboxFiles
from ._sync_git import SandboxGit
from ._sync_jobs import SandboxJobs
from ._sync_only import Heartbeats
from ._sync_sessions import SandboxSessions
from .models import SandboxInfo, Snapshot


class SandboxInstance(
    Heartbeats,
    SandboxJobs,
    SandboxExec,
    SandboxSessions,
    SandboxFiles,
    SandboxGit,
):
    """One sandbox. A context manager: leaving the ``with`` block deletes it.

    The compatible methods (``exec``, ``apply_patch``, ``upload_file``, ...) use the
    Orchard-compatible routes; the others use ``/v1`` (through the server, or straight
    to the sandbox's agent for a ``direct`` sandbox).
    """

    def __repr__(self) -> str:
        return describe(self.info, self.sandbox_id, self.direct)

    # --- lifecycle ---------------------------------------------------------------------

    def refresh(self) -> SandboxInfo:
        """Reloads :attr:`info` from the server."""
        self.info = self._driver.run(_ops.get_sandbox(self.sandbox_id, v1=self._v1))
        return self.info

    def wait_ready(self, timeout: float | None = 300) -> SandboxInfo:
        """Waits until the sandbox is ready (server-side wait); 408 → ``OrchardTimeoutError``."""
        self.info = self._driver.run(_ops.wait_sandbox(self.sandbox_id, timeout, v1=self._v1))
        return self.info

    def heartbeat(self) -> dict[str, Any]:
        """Keeps the sandbox alive: once heartbeats started, it is reaped when they stop."""
        return self._driver.run(_ops.heartbeat(self.sandbox_id))

    def delete(self) -> None:
        """Deletes the sandbox (quietly when it is already gone); stops its heartbeats.

        Afterwards its methods raise :class:`~orchard_env.SandboxDeletedError`, a
        ``RuntimeError``.
        """
        self.stop_heartbeat()
        self._deleted = True
        self._client._delete_quietly(self.sandbox_id)

    def detach(self) -> SandboxInstance:
        """Stops the client from deleting this sandbox at exit; returns it."""
        self._client._state.disown(self.sandbox_id)
        return self

    def __enter__(self) -> SandboxInstance:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.delete()

    # --- pause, resume, snapshot ----------------------------------------------------------

    @property
    def paused(self) -> bool:
        """Whether the sandbox was paused when :attr:`info` was last loaded."""
        return self.info.paused

    def pause(self) -> SandboxInfo:
        """Freezes the sandbox: its processes stop where they are, keep their memory, and
        use no CPU until :meth:`resume`. Returns (and stores in :attr:`info`) the
        sandbox's ``/v1`` description, ``paused`` set and ``status`` ``"paused"``.

        While paused, the server answers the sandbox's exec, file, process, session,
        terminal and git calls (compatible and ``/v1`` alike) with 409:
        :class:`~orchard_env.ConflictError` whose message says it is paused. A
        ``direct`` sandbox's calls go to its frozen agent and wait until the resume.
        Heartbeats and the time to live go on; pausing a paused sandbox is harmless.

        >>> sandbox.pause().status, sandbox.paused
        ('paused', True)
        >>> sandbox.resume().status, sandbox.paused
        ('running', False)
        """
        self._check()
        self.info = self._driver.run(_ops.pause_sandbox(self.sandbox_id))
        self._v1 = True  # refreshes must keep reporting `paused` (compatible answers do not)
        return self.info

    def resume(self) -> SandboxInfo:
        """Thaws a paused sandbox: its processes go on where they stopped, and its calls
        work again. Returns (and stores in :attr:`info`) its ``/v1`` description,
        ``paused`` cleared. Resuming a running sandbox is harmless."""
        self._check()
        self.info = self._driver.run(_ops.resume_sandbox(self.sandbox_id))
        self._v1 = True
        return self.info

    def snapshot(self, labels: Mapping[str, str] | None = None) -> Snapshot:
        """Captures the sandbox as an immutable :class:`~orchard_env.Snapshot` that
        :meth:`SandboxClient.fork` starts new sandboxes from.

        What is captured: the filesystem changes since the image (the local backend's
        in-memory ``/tmp`` included, copied into each fork), the image, environment,
        CPU, memory and network, and each live shell session's working directory,
        exported variables and functions. Running processes are NOT captured, and are
        never carried into forks: there is no process checkpointing (CRIU is not
        available on the servers' kernel). The sandbox is frozen only for the capture
        (``frozen_ms``) and goes on unchanged. Snapshots are content-addressed: the
        same state and ``labels`` give the same snapshot (an equal one taken before is
        answered, its ``sandbox_id`` that of its own sandbox). Forks share the snapshot's
        layers, and it cannot be deleted while any fork exists
        (:meth:`SandboxClient.delete_snapshot`). Snapshots count against the API key's
        snapshot bytes quota: :class:`~orchard_env.QuotaError` (429) past it.

        >>> snap = sandbox.snapshot(labels={"turn": "3"})
        >>> snap.labels, snap.processes, snap.sandbox_id == sandbox.id
        ({'turn': '3'}, 'none', True)
        >>> client.delete_snapshot(snap) >= 0
        True
        """
        self._check()
        return self._driver.run(_ops.take_snapshot(self.sandbox_id, labels))

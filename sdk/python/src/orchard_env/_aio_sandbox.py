"""One sandbox, :class:`AsyncSandboxInstance`: its lifecycle (wait, refresh, heartbeats,
delete), pause, resume and snapshot. Its other methods come from the classes it is made
of: :class:`AsyncSandboxJobs` (the compatible API), :class:`AsyncSandboxExec`,
:class:`AsyncSandboxSessions`, :class:`AsyncSandboxFiles` and :class:`AsyncSandboxGit`
(the ``/v1`` agent API)."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

from . import _cleanup, _ops
from ._aio_exec import AsyncSandboxExec
from ._aio_files import AsyncSandboxFiles
from ._aio_git import AsyncSandboxGit
from ._aio_jobs import AsyncSandboxJobs
from ._aio_only import AsyncHeartbeats
from ._aio_sessions import AsyncSandboxSessions
from ._base import describe
from ._retry import RetryPolicy
from .models import SandboxInfo, Snapshot


class AsyncSandboxInstance(
    AsyncHeartbeats,
    AsyncSandboxJobs,
    AsyncSandboxExec,
    AsyncSandboxSessions,
    AsyncSandboxFiles,
    AsyncSandboxGit,
):
    """Async :class:`~orchard_env.SandboxInstance`; ``async with`` deletes it on exit."""

    def __repr__(self) -> str:
        return describe(self.info, self.sandbox_id, self.direct)

    # --- lifecycle ---------------------------------------------------------------------

    async def refresh(self) -> SandboxInfo:
        """Reloads :attr:`info` from the server."""
        self.info = await self._driver.run(_ops.get_sandbox(self.sandbox_id, v1=self._v1))
        return self.info

    async def wait_ready(self, timeout: float | None = 300) -> SandboxInfo:
        """Waits until the sandbox is ready (server-side wait); 408 → ``OrchardTimeoutError``."""
        self.info = await self._driver.run(_ops.wait_sandbox(self.sandbox_id, timeout, v1=self._v1))
        return self.info

    async def heartbeat(self) -> dict[str, Any]:
        """Keeps the sandbox alive: once heartbeats started, it is reaped when they stop."""
        return await self._driver.run(_ops.heartbeat(self.sandbox_id))

    async def delete(self) -> None:
        """Deletes the sandbox (quietly when it is already gone); stops its heartbeats.

        Afterwards its methods raise :class:`~orchard_env.SandboxDeletedError`, a
        ``RuntimeError``.
        """
        self.stop_heartbeat()
        self._deleted = True
        await self._client._delete_quietly(self.sandbox_id)

    # Async only: scripts/unasync.py leaves it out of the sync twin (ASYNC_ONLY), whose
    # delete is already synchronous.
    def delete_sync(self) -> None:
        """Deletes the sandbox from synchronous code (a cleanup handler, ``__del__``, a
        closed event loop): one blocking request, best effort, never raises."""
        self.stop_heartbeat()
        self._deleted = True
        config = self._client._state.config
        try:
            _cleanup.delete_now(
                config.base_url,
                config.api_key,
                self.sandbox_id,
                timeout=10,
                retry=RetryPolicy(attempts=0),  # one short try: callers cannot wait long
            )
        except Exception:  # best effort by contract
            pass
        finally:
            self._client._state.disown(self.sandbox_id)

    def detach(self) -> AsyncSandboxInstance:
        """Stops the client from deleting this sandbox at exit; returns it."""
        self._client._state.disown(self.sandbox_id)
        return self

    async def __aenter__(self) -> AsyncSandboxInstance:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.delete()

    # --- pause, resume, snapshot ----------------------------------------------------------

    @property
    def paused(self) -> bool:
        """Whether the sandbox was paused when :attr:`info` was last loaded."""
        return self.info.paused

    async def pause(self) -> SandboxInfo:
        """Freezes the sandbox until :meth:`resume` (see :meth:`SandboxInstance.pause`);
        returns (and stores in :attr:`info`) its ``/v1`` description. While paused, its
        exec, file and other agent calls raise :class:`~orchard_env.ConflictError` (409,
        the message says it is paused)."""
        self._check()
        self.info = await self._driver.run(_ops.pause_sandbox(self.sandbox_id))
        self._v1 = True  # refreshes must keep reporting `paused` (compatible answers do not)
        return self.info

    async def resume(self) -> SandboxInfo:
        """Thaws a paused sandbox: its processes go on where they stopped, and its calls
        work again. Returns (and stores in :attr:`info`) its ``/v1`` description,
        ``paused`` cleared. Resuming a running sandbox is harmless."""
        self._check()
        self.info = await self._driver.run(_ops.resume_sandbox(self.sandbox_id))
        self._v1 = True
        return self.info

    async def snapshot(self, labels: Mapping[str, str] | None = None) -> Snapshot:
        """Captures the sandbox as a :class:`~orchard_env.Snapshot` (see
        :meth:`SandboxInstance.snapshot`): its filesystem changes, environment and shell
        sessions. Running processes are not captured and never carried into forks (no
        process checkpointing: CRIU is not available on the servers' kernel). Forks
        share its layers; it cannot be deleted while any fork exists."""
        self._check()
        return await self._driver.run(_ops.take_snapshot(self.sandbox_id, labels))

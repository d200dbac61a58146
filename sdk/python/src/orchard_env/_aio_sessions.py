"""Shell sessions and terminals through the ``/v1`` agent API:
:class:`AsyncSandboxSessions` (a base of :class:`~orchard_env.AsyncSandboxInstance`) and
the handles it makes, :class:`AsyncSession` and :class:`AsyncTerminal`."""

from __future__ import annotations

from collections.abc import Mapping

from . import _ops
from ._aio_core import AsyncClosing, AsyncSandboxCore, AsyncSandboxHandle, Command
from .models import PtyInfo, SessionInfo, SessionResult
from .pty import AsyncContainerProcess


class AsyncSandboxSessions(AsyncSandboxCore):
    """The session and terminal methods of :class:`~orchard_env.AsyncSandboxInstance`."""

    async def create_session(
        self,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        shell: str | None = None,
    ) -> AsyncSession:
        """Starts a persistent shell."""
        return AsyncSession(self, await self._run(_ops.create_session(cwd, env, shell)))

    async def list_sessions(self) -> list[SessionInfo]:
        """Every session of the sandbox."""
        return await self._run(_ops.list_sessions())

    async def get_session(self, session_id: str) -> AsyncSession:
        """A handle on an existing session."""
        return AsyncSession(self, await self._run(_ops.get_session(session_id)))

    async def create_pty(
        self,
        command: Command | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        rows: int | None = None,
        cols: int | None = None,
        login_shell: bool = False,
        idle_timeout: float | None = None,
    ) -> AsyncTerminal:
        """Starts a re-attachable terminal (see :meth:`SandboxInstance.create_pty`)."""
        info = await self._run(
            _ops.create_pty(
                command,
                cwd=cwd,
                env=env,
                rows=rows,
                cols=cols,
                login_shell=login_shell,
                idle_timeout=idle_timeout,
            )
        )
        return AsyncTerminal(self, info)

    async def list_ptys(self) -> list[PtyInfo]:
        """Every terminal of the sandbox."""
        return await self._run(_ops.list_ptys())

    async def get_pty(self, pty_id: str) -> AsyncTerminal:
        """A handle on an existing terminal (to re-attach)."""
        return AsyncTerminal(self, await self._run(_ops.get_pty(pty_id)))


class AsyncSession(AsyncSandboxHandle[SessionInfo], AsyncClosing):
    """Async :class:`~orchard_env.Session`; ``async with`` ends the shell on exit."""

    def __repr__(self) -> str:
        return f"<AsyncSession {self.id} shell={self.info.shell!r}>"

    async def run(self, command: str, *, timeout: float | None = None) -> SessionResult:
        """Runs shell text in the session; on ``timeout`` it is interrupted, the shell stays."""
        return await self._sandbox._run(_ops.session_run(self.id, command, timeout))

    async def refresh(self) -> SessionInfo:
        """Reloads :attr:`info`."""
        return await self._update(_ops.get_session(self.id))

    async def close(self) -> None:
        """Ends the shell and everything it started."""
        await self._sandbox._run(_ops.delete_session(self.id, missing_ok=True))


class AsyncTerminal(AsyncSandboxHandle[PtyInfo], AsyncClosing):
    """Async :class:`~orchard_env.Terminal`; ``async with`` closes the terminal on exit."""

    def __repr__(self) -> str:
        return f"<AsyncTerminal {self.id} argv={self.info.argv!r}>"

    async def attach(self, *, timeout: float = 30) -> AsyncContainerProcess:
        """Connects as a viewer (scrollback first); leaving ``async with`` detaches."""
        paths = _ops.pty_attach_paths(self._sandbox.sandbox_id, self.id)
        target = await self._sandbox._ws_target(paths)
        return await AsyncContainerProcess.open(target, init=None, timeout=timeout)

    async def resize(self, rows: int, cols: int) -> PtyInfo:
        """Sets the window size."""
        return await self._update(_ops.resize_pty(self.id, rows, cols))

    async def refresh(self) -> PtyInfo:
        """Reloads :attr:`info`."""
        return await self._update(_ops.get_pty(self.id))

    async def close(self) -> None:
        """Ends the program (SIGHUP, then SIGKILL) and the terminal."""
        await self._sandbox._run(_ops.delete_pty(self.id, missing_ok=True))

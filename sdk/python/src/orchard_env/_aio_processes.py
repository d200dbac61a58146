"""Background processes, sessions and terminals of a sandbox, through ``/v1``: the
methods :class:`AsyncSandboxInstance` has from :class:`AsyncProcessOps`."""

from __future__ import annotations

# unasync: async
# _sync_processes.py is generated from this module by scripts/unasync.py: edit here, then run it.
# unasync: end
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from . import _ops
from ._aio_handles import AsyncProcess, AsyncSession, AsyncTerminal
from ._ops import Command
from .models import ProcessInfo, PtyInfo, SessionInfo

if TYPE_CHECKING:
    from ._http import Op
    from .aio import AsyncSandboxInstance


class AsyncProcessOps:
    """Background processes, sessions and terminals (a part of
    :class:`AsyncSandboxInstance`)."""

    if TYPE_CHECKING:

        async def _run(self, op: Op[Any]) -> Any: ...

    def _me(self) -> AsyncSandboxInstance:
        # The handles hold the sandbox they belong to; only that class mixes this in.
        return cast("AsyncSandboxInstance", self)

    # --- /v1: background processes ---------------------------------------------------------

    async def start_process(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        shell: str | None = None,
    ) -> AsyncProcess:
        # unasync: async
        """Starts ``command`` in the background."""
        # unasync: sync
        # """Starts ``command`` in the background and returns a :class:`Process` handle.
        #
        # >>> p = sandbox.start_process("read x; echo got $x")
        # >>> _ = p.write_stdin("it\\n", eof=True)
        # >>> p.wait(timeout=30).exit_code, p.read_output().stdout
        # (0, b'got it\\n')
        # """
        # unasync: end
        body = _ops.exec_body(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, shell=shell)
        return AsyncProcess(self._me(), await self._run(_ops.start_process(body)))

    async def list_processes(self) -> list[ProcessInfo]:
        """Running background processes, and exited ones still kept."""
        result: list[ProcessInfo] = await self._run(_ops.list_processes())
        return result

    async def get_process(self, process_id: str) -> AsyncProcess:
        """A handle on an existing background process."""
        return AsyncProcess(self._me(), await self._run(_ops.get_process(process_id)))

    # --- /v1: sessions ------------------------------------------------------------------

    async def create_session(
        self,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        shell: str | None = None,
    ) -> AsyncSession:
        # unasync: async
        """Starts a persistent shell."""
        # unasync: sync
        # """Starts a persistent shell: ``cd``, ``export`` and functions carry over.
        #
        # >>> with sandbox.create_session() as s:
        # ...     _ = s.run("cd /tmp && export X=42")
        # ...     s.run("echo $PWD $X").stdout
        # '/tmp 42\\n'
        # """
        # unasync: end
        return AsyncSession(self._me(), await self._run(_ops.create_session(cwd, env, shell)))

    async def list_sessions(self) -> list[SessionInfo]:
        """Every session of the sandbox."""
        result: list[SessionInfo] = await self._run(_ops.list_sessions())
        return result

    async def get_session(self, session_id: str) -> AsyncSession:
        """A handle on an existing session."""
        return AsyncSession(self._me(), await self._run(_ops.get_session(session_id)))

    # --- /v1: terminals ----------------------------------------------------------------------

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
        # unasync: async
        """Starts a re-attachable terminal (see :meth:`SandboxInstance.create_pty`)."""
        # unasync: sync
        # """Starts ``command`` (default: an interactive shell) on a terminal that outlives
        # connections: :meth:`Terminal.attach` to use it, detach, attach again later.
        #
        # >>> term = sandbox.create_pty()
        # >>> with term.attach() as p:
        # ...     p.write("echo $((6*7))\\n")
        # ...     _ = p.read_until("42", timeout=30)
        # >>> with term.attach() as p:   # re-attach: the scrollback comes first
        # ...     b"42" in p.read_until("42", timeout=30)
        # True
        # >>> term.close()
        # """
        # unasync: end
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
        return AsyncTerminal(self._me(), info)

    async def list_ptys(self) -> list[PtyInfo]:
        """Every terminal of the sandbox."""
        result: list[PtyInfo] = await self._run(_ops.list_ptys())
        return result

    async def get_pty(self, pty_id: str) -> AsyncTerminal:
        """A handle on an existing terminal (to re-attach)."""
        return AsyncTerminal(self._me(), await self._run(_ops.get_pty(pty_id)))

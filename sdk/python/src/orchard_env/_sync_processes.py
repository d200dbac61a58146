# generated from _aio_processes.py by scripts/unasync.py; do not edit
"""Background processes, sessions and terminals of a sandbox, through ``/v1``: the
methods :class:`SandboxInstance` has from :class:`ProcessOps`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from . import _ops
from ._ops import Command
from ._sync_handles import Process, Session, Terminal
from .models import ProcessInfo, PtyInfo, SessionInfo

if TYPE_CHECKING:
    from ._http import Op
    from ._sync import SandboxInstance


class ProcessOps:
    """Background processes, sessions and terminals (a part of
    :class:`SandboxInstance`)."""

    if TYPE_CHECKING:

        def _run(self, op: Op[Any]) -> Any: ...

    def _me(self) -> SandboxInstance:
        # The handles hold the sandbox they belong to; only that class mixes this in.
        return cast("SandboxInstance", self)

    # --- /v1: background processes ---------------------------------------------------------

    def start_process(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        shell: str | None = None,
    ) -> Process:
        """Starts ``command`` in the background and returns a :class:`Process` handle.

        >>> p = sandbox.start_process("read x; echo got $x")
        >>> _ = p.write_stdin("it\\n", eof=True)
        >>> p.wait(timeout=30).exit_code, p.read_output().stdout
        (0, b'got it\\n')
        """
        body = _ops.exec_body(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, shell=shell)
        return Process(self._me(), self._run(_ops.start_process(body)))

    def list_processes(self) -> list[ProcessInfo]:
        """Running background processes, and exited ones still kept."""
        result: list[ProcessInfo] = self._run(_ops.list_processes())
        return result

    def get_process(self, process_id: str) -> Process:
        """A handle on an existing background process."""
        return Process(self._me(), self._run(_ops.get_process(process_id)))

    # --- /v1: sessions ------------------------------------------------------------------

    def create_session(
        self,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        shell: str | None = None,
    ) -> Session:
        """Starts a persistent shell: ``cd``, ``export`` and functions carry over.

        >>> with sandbox.create_session() as s:
        ...     _ = s.run("cd /tmp && export X=42")
        ...     s.run("echo $PWD $X").stdout
        '/tmp 42\\n'
        """
        return Session(self._me(), self._run(_ops.create_session(cwd, env, shell)))

    def list_sessions(self) -> list[SessionInfo]:
        """Every session of the sandbox."""
        result: list[SessionInfo] = self._run(_ops.list_sessions())
        return result

    def get_session(self, session_id: str) -> Session:
        """A handle on an existing session."""
        return Session(self._me(), self._run(_ops.get_session(session_id)))

    # --- /v1: terminals ----------------------------------------------------------------------

    def create_pty(
        self,
        command: Command | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        rows: int | None = None,
        cols: int | None = None,
        login_shell: bool = False,
        idle_timeout: float | None = None,
    ) -> Terminal:
        """Starts ``command`` (default: an interactive shell) on a terminal that outlives
        connections: :meth:`Terminal.attach` to use it, detach, attach again later.

        >>> term = sandbox.create_pty()
        >>> with term.attach() as p:
        ...     p.write("echo $((6*7))\\n")
        ...     _ = p.read_until("42", timeout=30)
        >>> with term.attach() as p:   # re-attach: the scrollback comes first
        ...     b"42" in p.read_until("42", timeout=30)
        True
        >>> term.close()
        """
        info = self._run(
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
        return Terminal(self._me(), info)

    def list_ptys(self) -> list[PtyInfo]:
        """Every terminal of the sandbox."""
        result: list[PtyInfo] = self._run(_ops.list_ptys())
        return result

    def get_pty(self, pty_id: str) -> Terminal:
        """A handle on an existing terminal (to re-attach)."""
        return Terminal(self._me(), self._run(_ops.get_pty(pty_id)))

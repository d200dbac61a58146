# generated from _aio_sessions.py by scripts/unasync.py; do not edit
"""Shell sessions and terminals through the ``/v1`` agent API:
:class:`SandboxSessions` (a base of :class:`~orchard_env.SandboxInstance`) and
the handles it makes, :class:`Session` and :class:`Terminal`."""

from __future__ import annotations

from collections.abc import Mapping

from . import _ops
from ._sync_core import Closing, Command, SandboxCore, SandboxHandle
from .models import PtyInfo, SessionInfo, SessionResult
from .pty import ContainerProcess


class SandboxSessions(SandboxCore):
    """The session and terminal methods of :class:`~orchard_env.SandboxInstance`."""

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
        return Session(self, self._run(_ops.create_session(cwd, env, shell)))

    def list_sessions(self) -> list[SessionInfo]:
        """Every session of the sandbox."""
        return self._run(_ops.list_sessions())

    def get_session(self, session_id: str) -> Session:
        """A handle on an existing session."""
        return Session(self, self._run(_ops.get_session(session_id)))

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
        return Terminal(self, info)

    def list_ptys(self) -> list[PtyInfo]:
        """Every terminal of the sandbox."""
        return self._run(_ops.list_ptys())

    def get_pty(self, pty_id: str) -> Terminal:
        """A handle on an existing terminal (to re-attach)."""
        return Terminal(self, self._run(_ops.get_pty(pty_id)))


class Session(SandboxHandle[SessionInfo], Closing):
    """A persistent shell in a sandbox (:meth:`SandboxInstance.create_session`).

    A context manager: leaving the block ends the shell.
    """

    def __repr__(self) -> str:
        return f"<Session {self.id} shell={self.info.shell!r}>"

    def run(self, command: str, *, timeout: float | None = None) -> SessionResult:
        """Runs shell text in the session; on ``timeout`` it is interrupted, the shell stays."""
        return self._sandbox._run(_ops.session_run(self.id, command, timeout))

    def refresh(self) -> SessionInfo:
        """Reloads :attr:`info`."""
        return self._update(_ops.get_session(self.id))

    def close(self) -> None:
        """Ends the shell and everything it started."""
        self._sandbox._run(_ops.delete_session(self.id, missing_ok=True))


class Terminal(SandboxHandle[PtyInfo], Closing):
    """A ``/v1`` terminal that outlives its connections (:meth:`SandboxInstance.create_pty`).

    A context manager: leaving the block closes the terminal.
    """

    def __repr__(self) -> str:
        return f"<Terminal {self.id} argv={self.info.argv!r}>"

    def attach(self, *, timeout: float = 30) -> ContainerProcess:
        """Connects as a viewer: the scrollback first, then live output. Leaving the
        ``with`` block of the returned process detaches; the terminal keeps running."""
        paths = _ops.pty_attach_paths(self._sandbox.sandbox_id, self.id)
        target = self._sandbox._ws_target(paths)
        return ContainerProcess.open(target, init=None, timeout=timeout)

    def resize(self, rows: int, cols: int) -> PtyInfo:
        """Sets the window size."""
        return self._update(_ops.resize_pty(self.id, rows, cols))

    def refresh(self) -> PtyInfo:
        """Reloads :attr:`info`."""
        return self._update(_ops.get_pty(self.id))

    def close(self) -> None:
        """Ends the program (SIGHUP, then SIGKILL) and the terminal."""
        self._sandbox._run(_ops.delete_pty(self.id, missing_ok=True))

# generated from _aio_handles.py by scripts/unasync.py; do not edit
"""Handles on things inside a sandbox, for the sync client: :class:`ExecStream`,
:class:`Process`, :class:`Session` and :class:`Terminal` (made by
:class:`~orchard_env.SandboxInstance` methods; split from ``_sync`` to keep it short).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from . import _ops
from ._http import Request, transport_error
from ._streams import NdjsonDecoder, exec_event
from .models import (
    ExecEvent,
    ExecExit,
    ProcessInfo,
    ProcessOutput,
    PtyInfo,
    SessionInfo,
    SessionResult,
)
from .pty import ContainerProcess

if TYPE_CHECKING:
    from ._sync import SandboxInstance

__all__ = ["ExecStream", "Process", "Session", "Terminal"]


class ExecStream:
    """The events of a streamed command (:meth:`SandboxInstance.exec_stream`).

    Iterable once; a context manager that closes the connection when left early.
    After the last event, :attr:`exit` holds the :class:`~orchard_env.ExecExit`.
    """

    def __init__(self, sandbox: SandboxInstance, request: Request) -> None:
        self._sandbox = sandbox
        self._request = request
        self._cm: Any = None
        self._response: httpx.Response | None = None
        #: How the command ended, once the stream is over.
        self.exit: ExecExit | None = None

    def _start(self) -> httpx.Response:
        if self._response is None:
            self._cm = self._sandbox._driver.stream(self._request, self._sandbox._route())
            self._response = self._cm.__enter__()
        return self._response

    def __iter__(self) -> Iterator[ExecEvent]:
        response = self._start()
        decoder = NdjsonDecoder()
        try:
            for chunk in response.iter_bytes():
                for frame in decoder.feed(chunk):
                    event = exec_event(frame)
                    if event is None:
                        continue
                    if isinstance(event, ExecExit):
                        self.exit = event
                    yield event
            for frame in decoder.end():
                event = exec_event(frame)
                if event is not None:
                    if isinstance(event, ExecExit):
                        self.exit = event
                    yield event
        except httpx.HTTPError as err:
            raise transport_error(err, self._request) from err
        finally:
            self.close()

    def close(self) -> None:
        """Closes the connection (the command keeps running unless ``kill_on_disconnect``)."""
        if self._cm is not None:
            cm, self._cm = self._cm, None
            cm.__exit__(None, None, None)

    def __enter__(self) -> ExecStream:
        self._start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Process:
    """A background process in a sandbox (:meth:`SandboxInstance.start_process`)."""

    def __init__(self, sandbox: SandboxInstance, info: ProcessInfo) -> None:
        self._sandbox = sandbox
        #: The process as last seen.
        self.info = info
        self._stdout_offset = 0
        self._stderr_offset = 0

    @property
    def id(self) -> str:
        """The agent's id of the process."""
        return self.info.id

    @property
    def pid(self) -> int:
        """Its pid in the sandbox."""
        return self.info.pid

    def __repr__(self) -> str:
        return f"<Process {self.id} pid={self.pid} state={self.info.state}>"

    def refresh(self) -> ProcessInfo:
        """Reloads :attr:`info`."""
        self.info = self._sandbox._run(_ops.get_process(self.id))
        return self.info

    def read_output(self, max_bytes: int | None = None) -> ProcessOutput:
        """Output written since the previous call (offsets are tracked here)."""
        out = self._sandbox._run(
            _ops.process_output(self.id, self._stdout_offset, self._stderr_offset, max_bytes)
        )
        self._stdout_offset = out.stdout_next_offset
        self._stderr_offset = out.stderr_next_offset
        self.info = out.process
        return out

    def write_stdin(self, data: str | bytes, *, eof: bool = False) -> ProcessInfo:
        """Writes to its stdin, and closes it with ``eof``."""
        self.info = self._sandbox._run(_ops.process_stdin(self.id, data, eof))
        return self.info

    def close_stdin(self) -> ProcessInfo:
        """Closes its stdin."""
        self.info = self._sandbox._run(_ops.process_stdin(self.id, None, True))
        return self.info

    def send_signal(self, sig: str | int = "TERM", *, group: bool = True) -> ProcessInfo:
        """Sends a signal to its process group (or only to it)."""
        self.info = self._sandbox._run(_ops.process_signal(self.id, sig, group))
        return self.info

    def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Waits for it to end (at most ``timeout`` seconds); returns it as it is then."""
        self.info = self._sandbox._run(_ops.process_wait(self.id, timeout))
        return self.info

    def kill(self) -> None:
        """Kills its process group if running, and forgets it."""
        self._sandbox._run(_ops.delete_process(self.id))


class Session:
    """A persistent shell in a sandbox (:meth:`SandboxInstance.create_session`).

    A context manager: leaving the block ends the shell.
    """

    def __init__(self, sandbox: SandboxInstance, info: SessionInfo) -> None:
        self._sandbox = sandbox
        #: The session as last seen.
        self.info = info

    @property
    def id(self) -> str:
        """The agent's id of the session."""
        return self.info.id

    def __repr__(self) -> str:
        return f"<Session {self.id} shell={self.info.shell!r}>"

    def run(self, command: str, *, timeout: float | None = None) -> SessionResult:
        """Runs shell text in the session; on ``timeout`` it is interrupted, the shell stays."""
        return self._sandbox._run(_ops.session_run(self.id, command, timeout))

    def refresh(self) -> SessionInfo:
        """Reloads :attr:`info`."""
        self.info = self._sandbox._run(_ops.get_session(self.id))
        return self.info

    def close(self) -> None:
        """Ends the shell and everything it started."""
        self._sandbox._run(_ops.delete_session(self.id, missing_ok=True))

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Terminal:
    """A ``/v1`` terminal that outlives its connections (:meth:`SandboxInstance.create_pty`).

    A context manager: leaving the block closes the terminal.
    """

    def __init__(self, sandbox: SandboxInstance, info: PtyInfo) -> None:
        self._sandbox = sandbox
        #: The terminal as last seen.
        self.info = info

    @property
    def id(self) -> str:
        """The agent's id of the terminal."""
        return self.info.id

    def __repr__(self) -> str:
        return f"<Terminal {self.id} argv={self.info.argv!r}>"

    def attach(self, *, timeout: float = 30) -> ContainerProcess:
        """Connects as a viewer: the scrollback first, then live output. Leaving the
        ``with`` block of the returned process detaches; the terminal keeps running."""
        target = self._sandbox._attach_target(self.id)
        return ContainerProcess.open(target, init=None, timeout=timeout)

    def resize(self, rows: int, cols: int) -> PtyInfo:
        """Sets the window size."""
        self.info = self._sandbox._run(_ops.resize_pty(self.id, rows, cols))
        return self.info

    def refresh(self) -> PtyInfo:
        """Reloads :attr:`info`."""
        self.info = self._sandbox._run(_ops.get_pty(self.id))
        return self.info

    def close(self) -> None:
        """Ends the program (SIGHUP, then SIGKILL) and the terminal."""
        self._sandbox._run(_ops.delete_pty(self.id, missing_ok=True))

    def __enter__(self) -> Terminal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

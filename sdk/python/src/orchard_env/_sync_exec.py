# generated from _aio_exec.py by scripts/unasync.py; do not edit
"""Commands through the ``/v1`` agent API: :class:`SandboxExec` (a base of
:class:`~orchard_env.SandboxInstance`: run, stream, background processes) and the
handles it makes, :class:`ExecStream` and :class:`Process`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import httpx

from . import _ops
from ._http import Request, transport_error
from ._streams import ExecDecoder
from ._sync_core import Command, SandboxCore, SandboxHandle
from ._sync_only import ExecIteration
from .models import ExecEvent, ExecExit, ExecResult, ProcessInfo, ProcessOutput


class SandboxExec(SandboxCore):
    """The ``/v1`` exec and process methods of :class:`~orchard_env.SandboxInstance`."""

    def run(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
        shell: str | None = None,
    ) -> ExecResult:
        """Runs ``command`` through ``/v1`` and returns exit code, signal and both streams.

        Unlike :meth:`exec`, commands run concurrently, ``stdin`` can be given, and a
        command killed at its ``timeout`` (seconds) says so in ``timed_out``.

        >>> sandbox.run("cat", stdin="from stdin").stdout
        'from stdin'
        >>> sandbox.run("sleep 5", timeout=0.2).timed_out
        True
        """
        body = _ops.exec_body(
            command,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            shell=shell,
        )
        return self._run(_ops.run(body, timeout))

    def exec_stream(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        shell: str | None = None,
        kill_on_disconnect: bool = False,
    ) -> ExecStream:
        """Runs ``command`` and yields its events as they happen.

        Iterate it (or use it in a ``with`` block and iterate): an
        :class:`~orchard_env.ExecStart`, then :class:`~orchard_env.ExecOutput` chunks,
        then an :class:`~orchard_env.ExecExit`. The command starts when iteration does.
        With ``kill_on_disconnect`` the command is killed if the stream is closed early.

        >>> events = list(sandbox.exec_stream("echo one; echo two"))
        >>> b"".join(e.data for e in events if isinstance(e, ExecOutput)), events[-1].exit_code
        (b'one\\ntwo\\n', 0)
        """
        body = _ops.exec_body(
            command,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            shell=shell,
            kill_on_disconnect=kill_on_disconnect,
        )
        return ExecStream(self, _ops.exec_stream_request(body))

    def agent_health(self) -> dict[str, Any]:
        """The agent's health: version, uptime, processes, memory and CPU, limits."""
        return self._run(_ops.agent_health())

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
        return Process(self, self._run(_ops.start_process(body)))

    def list_processes(self) -> list[ProcessInfo]:
        """Running background processes, and exited ones still kept."""
        return self._run(_ops.list_processes())

    def get_process(self, process_id: str) -> Process:
        """A handle on an existing background process."""
        return Process(self, self._run(_ops.get_process(process_id)))


class ExecStream(ExecIteration):
    """The events of a streamed command (:meth:`SandboxInstance.exec_stream`).

    Iterable once; a context manager that closes the connection when left early.
    After the last event, :attr:`exit` holds the :class:`~orchard_env.ExecExit`.
    """

    def __init__(self, sandbox: SandboxCore, request: Request) -> None:
        self._sandbox = sandbox
        self._request = request
        self._cm: Any = None
        self._response: httpx.Response | None = None
        self._decoder = ExecDecoder()
        #: How the command ended, once the stream is over.
        self.exit: ExecExit | None = None

    def _start(self) -> httpx.Response:
        if self._response is None:
            route = self._sandbox._route()
            self._cm = self._sandbox._driver.stream(self._request, route)
            self._response = self._cm.__enter__()
        return self._response

    def _events(self) -> Iterator[ExecEvent]:
        """Each event of the command (keep-alives left out), then closes the stream."""
        try:
            response = self._start()
            for chunk in response.iter_bytes():
                for event in self._decoder.feed(chunk):
                    yield self._seen(event)
            for event in self._decoder.end():
                yield self._seen(event)
        except httpx.HTTPError as err:
            raise transport_error(err, self._request) from err
        finally:
            self.close()

    def _seen(self, event: ExecEvent) -> ExecEvent:
        if isinstance(event, ExecExit):
            self.exit = event
        return event

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


class Process(SandboxHandle[ProcessInfo]):
    """A background process in a sandbox (:meth:`SandboxInstance.start_process`)."""

    def __init__(self, sandbox: SandboxCore, info: ProcessInfo) -> None:
        super().__init__(sandbox, info)
        self._stdout_offset = 0
        self._stderr_offset = 0

    @property
    def pid(self) -> int:
        """Its pid in the sandbox."""
        return self.info.pid

    def __repr__(self) -> str:
        return f"<Process {self.id} pid={self.pid} state={self.info.state}>"

    def refresh(self) -> ProcessInfo:
        """Reloads :attr:`info`."""
        return self._update(_ops.get_process(self.id))

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
        return self._update(_ops.process_stdin(self.id, data, eof))

    def close_stdin(self) -> ProcessInfo:
        """Closes its stdin."""
        return self._update(_ops.process_stdin(self.id, None, True))

    def send_signal(self, sig: str | int = "TERM", *, group: bool = True) -> ProcessInfo:
        """Sends a signal to its process group (or only to it)."""
        return self._update(_ops.process_signal(self.id, sig, group))

    def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Waits for it to end (at most ``timeout`` seconds); returns it as it is then."""
        return self._update(_ops.process_wait(self.id, timeout))

    def kill(self) -> None:
        """Kills its process group if running, and forgets it."""
        self._sandbox._run(_ops.delete_process(self.id))

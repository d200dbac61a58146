"""Commands through the ``/v1`` agent API: :class:`AsyncSandboxExec` (a base of
:class:`~orchard_env.AsyncSandboxInstance`: run, stream, background processes) and the
handles it makes, :class:`AsyncExecStream` and :class:`AsyncProcess`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

import httpx

from . import _ops
from ._aio_core import AsyncSandboxCore, AsyncSandboxHandle, Command
from ._aio_only import AsyncExecIteration
from ._http import Request, transport_error
from ._streams import ExecDecoder
from .models import ExecEvent, ExecExit, ExecResult, ProcessInfo, ProcessOutput


class AsyncSandboxExec(AsyncSandboxCore):
    """The ``/v1`` exec and process methods of :class:`~orchard_env.AsyncSandboxInstance`."""

    async def run(
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
        """Runs ``command`` through ``/v1`` (see :meth:`SandboxInstance.run`)."""
        body = _ops.exec_body(
            command,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            shell=shell,
        )
        return await self._run(_ops.run(body, timeout))

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
    ) -> AsyncExecStream:
        """The events of ``command`` as an async iterator (``async for``; ``async with``
        closes it when left early). See :meth:`SandboxInstance.exec_stream`."""
        body = _ops.exec_body(
            command,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            shell=shell,
            kill_on_disconnect=kill_on_disconnect,
        )
        return AsyncExecStream(self, _ops.exec_stream_request(body))

    async def agent_health(self) -> dict[str, Any]:
        """The agent's health: version, uptime, processes, memory and CPU, limits."""
        return await self._run(_ops.agent_health())

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
        """Starts ``command`` in the background."""
        body = _ops.exec_body(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, shell=shell)
        return AsyncProcess(self, await self._run(_ops.start_process(body)))

    async def list_processes(self) -> list[ProcessInfo]:
        """Running background processes, and exited ones still kept."""
        return await self._run(_ops.list_processes())

    async def get_process(self, process_id: str) -> AsyncProcess:
        """A handle on an existing background process."""
        return AsyncProcess(self, await self._run(_ops.get_process(process_id)))


class AsyncExecStream(AsyncExecIteration):
    """Async :class:`~orchard_env.ExecStream`: ``async for`` over the events."""

    def __init__(self, sandbox: AsyncSandboxCore, request: Request) -> None:
        self._sandbox = sandbox
        self._request = request
        self._cm: Any = None
        self._response: httpx.Response | None = None
        self._decoder = ExecDecoder()
        #: How the command ended, once the stream is over.
        self.exit: ExecExit | None = None

    async def _start(self) -> httpx.Response:
        if self._response is None:
            route = await self._sandbox._route()
            self._cm = self._sandbox._driver.stream(self._request, route)
            self._response = await self._cm.__aenter__()
        return self._response

    async def _events(self) -> AsyncIterator[ExecEvent]:
        """Each event of the command (keep-alives left out), then closes the stream."""
        try:
            response = await self._start()
            async for chunk in response.aiter_bytes():
                for event in self._decoder.feed(chunk):
                    yield self._seen(event)
            for event in self._decoder.end():
                yield self._seen(event)
        except httpx.HTTPError as err:
            raise transport_error(err, self._request) from err
        finally:
            await self.aclose()

    def _seen(self, event: ExecEvent) -> ExecEvent:
        if isinstance(event, ExecExit):
            self.exit = event
        return event

    async def aclose(self) -> None:
        """Closes the connection (the command keeps running unless ``kill_on_disconnect``)."""
        if self._cm is not None:
            cm, self._cm = self._cm, None
            await cm.__aexit__(None, None, None)

    async def __aenter__(self) -> AsyncExecStream:
        await self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class AsyncProcess(AsyncSandboxHandle[ProcessInfo]):
    """Async :class:`~orchard_env.Process`."""

    def __init__(self, sandbox: AsyncSandboxCore, info: ProcessInfo) -> None:
        super().__init__(sandbox, info)
        self._stdout_offset = 0
        self._stderr_offset = 0

    @property
    def pid(self) -> int:
        """Its pid in the sandbox."""
        return self.info.pid

    def __repr__(self) -> str:
        return f"<AsyncProcess {self.id} pid={self.pid} state={self.info.state}>"

    async def refresh(self) -> ProcessInfo:
        """Reloads :attr:`info`."""
        return await self._update(_ops.get_process(self.id))

    async def read_output(self, max_bytes: int | None = None) -> ProcessOutput:
        """Output written since the previous call (offsets are tracked here)."""
        out = await self._sandbox._run(
            _ops.process_output(self.id, self._stdout_offset, self._stderr_offset, max_bytes)
        )
        self._stdout_offset = out.stdout_next_offset
        self._stderr_offset = out.stderr_next_offset
        self.info = out.process
        return out

    async def write_stdin(self, data: str | bytes, *, eof: bool = False) -> ProcessInfo:
        """Writes to its stdin, and closes it with ``eof``."""
        return await self._update(_ops.process_stdin(self.id, data, eof))

    async def close_stdin(self) -> ProcessInfo:
        """Closes its stdin."""
        return await self._update(_ops.process_stdin(self.id, None, True))

    async def send_signal(self, sig: str | int = "TERM", *, group: bool = True) -> ProcessInfo:
        """Sends a signal to its process group (or only to it)."""
        return await self._update(_ops.process_signal(self.id, sig, group))

    async def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Waits for it to end (at most ``timeout`` seconds); returns it as it is then."""
        return await self._update(_ops.process_wait(self.id, timeout))

    async def kill(self) -> None:
        """Kills its process group if running, and forgets it."""
        await self._sandbox._run(_ops.delete_process(self.id))

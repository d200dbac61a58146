# unasync: async
"""Handles on things inside a sandbox, for the async client: :class:`AsyncExecStream`,
:class:`AsyncProcess`, :class:`AsyncSession` and :class:`AsyncTerminal` (made by
:class:`~orchard_env.AsyncSandboxInstance` methods; split from ``aio`` to keep it short).
"""
# unasync: sync
# """Handles on things inside a sandbox, for the sync client: :class:`ExecStream`,
# :class:`Process`, :class:`Session` and :class:`Terminal` (made by
# :class:`~orchard_env.SandboxInstance` methods; split from ``_sync`` to keep it short).
# """
# unasync: end

from __future__ import annotations

# unasync: async
# _sync_handles.py is generated from this module by scripts/unasync.py: edit here, then run it.
# The "# unasync:" comments mark where the sync side differs in more than names.
# unasync: end
# unasync: async
import asyncio

# unasync: end
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from . import _ops
from ._http import Request, transport_error
from ._streams import NdjsonDecoder, exec_event

# unasync: async
from .errors import OrchardError

# unasync: end
from .models import (
    ExecEvent,
    ExecExit,
    ProcessInfo,
    ProcessOutput,
    PtyInfo,
    SessionInfo,
    SessionResult,
)
from .pty import AsyncContainerProcess

if TYPE_CHECKING:
    from .aio import AsyncSandboxInstance

__all__ = ["AsyncExecStream", "AsyncProcess", "AsyncSession", "AsyncTerminal"]


class AsyncExecStream:
    # unasync: async
    """Async :class:`~orchard_env.ExecStream`: ``async for`` over the events."""

    # unasync: sync
    # """The events of a streamed command (:meth:`SandboxInstance.exec_stream`).
    #
    # Iterable once; a context manager that closes the connection when left early.
    # After the last event, :attr:`exit` holds the :class:`~orchard_env.ExecExit`.
    # """
    # unasync: end

    def __init__(self, sandbox: AsyncSandboxInstance, request: Request) -> None:
        self._sandbox = sandbox
        self._request = request
        self._cm: Any = None
        # unasync: async
        self._chunks: AsyncIterator[bytes] | None = None
        self._pending: list[Any] = []
        self._decoder = NdjsonDecoder()
        self._done = False
        # unasync: sync
        # self._response: httpx.Response | None = None
        # unasync: end
        #: How the command ended, once the stream is over.
        self.exit: ExecExit | None = None

    # unasync: async
    async def _start(self) -> AsyncIterator[bytes]:
        if self._chunks is None:
            route = await self._sandbox._route()
            self._cm = self._sandbox._driver.stream(self._request, route)
            response = await self._cm.__aenter__()
            self._chunks = response.aiter_bytes()
        return self._chunks

    def __aiter__(self) -> AsyncExecStream:
        return self

    async def __anext__(self) -> ExecEvent:
        try:
            chunks = await self._start()
            while True:
                while self._pending:
                    event = exec_event(self._pending.pop(0))
                    if event is None:
                        continue
                    if isinstance(event, ExecExit):
                        self.exit = event
                    return event
                if self._done:
                    await self.aclose()
                    raise StopAsyncIteration
                try:
                    chunk = await chunks.__anext__()
                    self._pending.extend(self._decoder.feed(chunk))
                except StopAsyncIteration:
                    self._done = True
                    self._pending.extend(self._decoder.end())
        except httpx.HTTPError as err:
            await self.aclose()
            raise transport_error(err, self._request) from err
        except (OrchardError, asyncio.CancelledError):
            await self.aclose()
            raise

    # unasync: sync
    # def _start(self) -> httpx.Response:
    #     if self._response is None:
    #         self._cm = self._sandbox._driver.stream(self._request, self._sandbox._route())
    #         self._response = self._cm.__enter__()
    #     return self._response
    #
    # def __iter__(self) -> Iterator[ExecEvent]:
    #     response = self._start()
    #     decoder = NdjsonDecoder()
    #     try:
    #         for chunk in response.iter_bytes():
    #             for frame in decoder.feed(chunk):
    #                 event = exec_event(frame)
    #                 if event is None:
    #                     continue
    #                 if isinstance(event, ExecExit):
    #                     self.exit = event
    #                 yield event
    #         for frame in decoder.end():
    #             event = exec_event(frame)
    #             if event is not None:
    #                 if isinstance(event, ExecExit):
    #                     self.exit = event
    #                 yield event
    #     except httpx.HTTPError as err:
    #         raise transport_error(err, self._request) from err
    #     finally:
    #         self.close()
    # unasync: end

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


class AsyncProcess:
    # unasync: async
    """Async :class:`~orchard_env.Process`."""

    # unasync: sync
    # """A background process in a sandbox (:meth:`SandboxInstance.start_process`)."""
    # unasync: end

    def __init__(self, sandbox: AsyncSandboxInstance, info: ProcessInfo) -> None:
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
        return f"<AsyncProcess {self.id} pid={self.pid} state={self.info.state}>"

    async def refresh(self) -> ProcessInfo:
        """Reloads :attr:`info`."""
        self.info = await self._sandbox._run(_ops.get_process(self.id))
        return self.info

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
        self.info = await self._sandbox._run(_ops.process_stdin(self.id, data, eof))
        return self.info

    async def close_stdin(self) -> ProcessInfo:
        """Closes its stdin."""
        self.info = await self._sandbox._run(_ops.process_stdin(self.id, None, True))
        return self.info

    async def send_signal(self, sig: str | int = "TERM", *, group: bool = True) -> ProcessInfo:
        """Sends a signal to its process group (or only to it)."""
        self.info = await self._sandbox._run(_ops.process_signal(self.id, sig, group))
        return self.info

    async def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Waits for it to end (at most ``timeout`` seconds); returns it as it is then."""
        self.info = await self._sandbox._run(_ops.process_wait(self.id, timeout))
        return self.info

    async def kill(self) -> None:
        """Kills its process group if running, and forgets it."""
        await self._sandbox._run(_ops.delete_process(self.id))


class AsyncSession:
    # unasync: async
    """Async :class:`~orchard_env.Session`; ``async with`` ends the shell on exit."""

    # unasync: sync
    # """A persistent shell in a sandbox (:meth:`SandboxInstance.create_session`).
    #
    # A context manager: leaving the block ends the shell.
    # """
    # unasync: end

    def __init__(self, sandbox: AsyncSandboxInstance, info: SessionInfo) -> None:
        self._sandbox = sandbox
        #: The session as last seen.
        self.info = info

    @property
    def id(self) -> str:
        """The agent's id of the session."""
        return self.info.id

    def __repr__(self) -> str:
        return f"<AsyncSession {self.id} shell={self.info.shell!r}>"

    async def run(self, command: str, *, timeout: float | None = None) -> SessionResult:
        """Runs shell text in the session; on ``timeout`` it is interrupted, the shell stays."""
        return await self._sandbox._run(_ops.session_run(self.id, command, timeout))

    async def refresh(self) -> SessionInfo:
        """Reloads :attr:`info`."""
        self.info = await self._sandbox._run(_ops.get_session(self.id))
        return self.info

    async def close(self) -> None:
        """Ends the shell and everything it started."""
        await self._sandbox._run(_ops.delete_session(self.id, missing_ok=True))

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncTerminal:
    # unasync: async
    """Async :class:`~orchard_env.Terminal`; ``async with`` closes the terminal on exit."""

    # unasync: sync
    # """A ``/v1`` terminal that outlives its connections (:meth:`SandboxInstance.create_pty`).
    #
    # A context manager: leaving the block closes the terminal.
    # """
    # unasync: end

    def __init__(self, sandbox: AsyncSandboxInstance, info: PtyInfo) -> None:
        self._sandbox = sandbox
        #: The terminal as last seen.
        self.info = info

    @property
    def id(self) -> str:
        """The agent's id of the terminal."""
        return self.info.id

    def __repr__(self) -> str:
        return f"<AsyncTerminal {self.id} argv={self.info.argv!r}>"

    async def attach(self, *, timeout: float = 30) -> AsyncContainerProcess:
        # unasync: async
        """Connects as a viewer (scrollback first); leaving ``async with`` detaches."""
        # unasync: sync
        # """Connects as a viewer: the scrollback first, then live output. Leaving the
        # ``with`` block of the returned process detaches; the terminal keeps running."""
        # unasync: end
        target = await self._sandbox._attach_target(self.id)
        return await AsyncContainerProcess.open(target, init=None, timeout=timeout)

    async def resize(self, rows: int, cols: int) -> PtyInfo:
        """Sets the window size."""
        self.info = await self._sandbox._run(_ops.resize_pty(self.id, rows, cols))
        return self.info

    async def refresh(self) -> PtyInfo:
        """Reloads :attr:`info`."""
        self.info = await self._sandbox._run(_ops.get_pty(self.id))
        return self.info

    async def close(self) -> None:
        """Ends the program (SIGHUP, then SIGKILL) and the terminal."""
        await self._sandbox._run(_ops.delete_pty(self.id, missing_ok=True))

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

"""Terminal processes over WebSocket: :class:`ContainerProcess` and its async twin.

Two protocols end here. The compatible one (``/sandboxes/{id}/exec/pty``, or
``/v1/pty/compat`` on the agent) starts a program with an ``init`` frame and ends when
the connection does: that is what ``sandbox.exec(cmd, pty=True)`` returns. The ``/v1``
one attaches to a terminal that lives on its own (:meth:`SandboxInstance.create_pty`):
the scrollback is replayed first, and :meth:`ContainerProcess.detach` leaves it running
for a later re-attach. Frame handling is shared (:class:`PtyProtocol`); the two classes
only differ in how they wait for the socket.

>>> with sandbox.exec("read name; echo hello $name", pty=True) as proc:
...     proc.write("orchard\\n")
...     proc.wait(timeout=30)
...     b"hello orchard" in proc.read_available()
0
True
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as async_connect
from websockets.asyncio.client import unix_connect as async_unix_connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

from .errors import (
    OrchardConnectionError,
    OrchardError,
    OrchardTimeoutError,
    TerminalError,
    error_from_body,
    error_from_close_code,
)
from .models import PtyInfo

__all__ = ["ContainerProcess", "AsyncContainerProcess", "PtyProtocol", "WsTarget"]

_OPEN_TIMEOUT = 30.0


@dataclass
class WsTarget:
    """Where a terminal WebSocket connects: a ``ws://`` URL, headers, maybe a Unix socket."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    uds: str | None = None

    @staticmethod
    def make(
        base_url: str,
        path: str,
        headers: Mapping[str, str],
        uds: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> WsTarget:
        """Turns an HTTP base URL and a path into a WebSocket target."""
        base = base_url.rstrip("/")
        if base.startswith("https://"):
            base = "wss://" + base[len("https://") :]
        elif base.startswith("http://"):
            base = "ws://" + base[len("http://") :]
        url = base + path
        if query:
            url += "?" + urlencode(query)
        return WsTarget(url, dict(headers), uds)


class PtyProtocol:
    """Sans-I/O frames of both terminal protocols and the state they lead to.

    >>> p = PtyProtocol(compat=True)
    >>> p.handle('{"type": "ready", "pid": 7}'), p.pid
    (b'', 7)
    >>> p.handle('{"type": "stdout", "data": "aGk="}')
    b'hi'
    >>> p.handle('{"type": "exit", "code": 0}'), p.exited, p.exit_code
    (b'', True, 0)
    """

    def __init__(self, compat: bool) -> None:
        self.compat = compat
        self.pid: int | None = None
        self.info: PtyInfo | None = None
        self.started = False
        self.exited = False
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.errors: list[str] = []

    def handle(self, text: str | bytes) -> bytes:
        """Takes one server frame; returns the terminal output it carries (maybe empty)."""
        frame: dict[str, Any] = json.loads(text)
        kind = frame.get("type")
        if kind in ("stdout", "output"):
            return base64.b64decode(frame.get("data", ""))
        if kind == "ready":
            self.pid = int(frame.get("pid", 0))
            self.started = True
        elif kind == "attached":
            self.info = PtyInfo.from_json(frame.get("pty") or {})
            self.pid = self.info.pid
            self.started = True
        elif kind == "exit":
            self.exited = True
            self.exit_code = frame.get("code")
            self.signal = frame.get("signal")
        elif kind == "error":
            message = str(frame.get("message", "terminal error"))
            self.errors.append(message)
            if not self.started:
                raise OrchardError(message, code="pty_error")
        return b""

    @staticmethod
    def stdin(data: str | bytes) -> str:
        """A keystrokes frame."""
        raw = data.encode() if isinstance(data, str) else data
        return json.dumps({"type": "stdin", "data": base64.b64encode(raw).decode()})

    @staticmethod
    def resize(rows: int, cols: int) -> str:
        """A window-size frame."""
        return json.dumps({"type": "resize", "rows": rows, "cols": cols})

    @staticmethod
    def signal_frame(sig: str | int) -> str:
        """A signal frame for the foreground process group."""
        return json.dumps({"type": "signal", "sig": sig})

    @staticmethod
    def close() -> str:
        """Ends the program and the connection."""
        return json.dumps({"type": "close"})

    @staticmethod
    def detach() -> str:
        """Leaves a ``/v1`` terminal running."""
        return json.dumps({"type": "detach"})


def _handshake_error(err: InvalidStatus) -> OrchardError:
    response = err.response
    return error_from_body(response.status_code, bytes(response.body or b""))


@contextlib.contextmanager
def _connecting() -> Iterator[None]:
    """Turns a WebSocket connection that could not be opened into the SDK's error: the
    server's refusal (a handshake status), or no connection at all."""
    try:
        yield
    except InvalidStatus as err:
        raise _handshake_error(err) from err
    except (OSError, builtins.TimeoutError) as err:
        raise OrchardConnectionError(f"terminal connection failed: {err}") from err


def _closed_error(err: ConnectionClosed) -> OrchardError:
    frame = err.rcvd
    code = frame.code if frame is not None else None
    reason = frame.reason if frame is not None else ""
    return error_from_close_code(code, reason)


def _is_normal_close(err: ConnectionClosed) -> bool:
    frame = err.rcvd
    return frame is None or frame.code in (1000, 1001, 1005)


class SyncWebSocket:
    """A minimal blocking WebSocket client on websockets' sans-I/O protocol.

    Single-threaded: frames are read only when the caller waits for one. Unlike a
    connection with a reader thread, frames that arrived together with the server's
    Close are never lost when answering that Close fails because the server already
    hung up (which an agent does right after its last frame).
    """

    def __init__(self, target: WsTarget, timeout: float | None) -> None:
        uri = parse_uri(target.url)
        deadline = _deadline(timeout)
        if target.uds:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(target.uds)
        else:
            sock = socket.create_connection((uri.host, uri.port), timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if uri.secure:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=uri.host)
        self._sock = sock
        #: Guards ``_proto`` and writes to the socket: a thread may send (keystrokes,
        #: signals, resizes) while another is blocked reading. Never held while waiting
        #: for the peer.
        self._lock = threading.Lock()
        self._proto = ClientProtocol(uri, max_size=None)
        self._frames: list[str] = []
        self._partial: list[bytes] = []
        request = self._proto.connect()
        request.headers.update(target.headers)
        with self._lock:
            self._proto.send_request(request)
            self._flush()
        response: Response | None = None
        while response is None:
            for event in self._read(_left(deadline)):
                if isinstance(event, Response):
                    response = event
            if response is None and self._proto.state is State.CLOSED:
                break
        if self._proto.handshake_exc is not None:
            self._sock.close()
            raise self._proto.handshake_exc
        if response is None:
            self._sock.close()
            raise ConnectionError("connection closed during the WebSocket handshake")

    def _flush(self) -> None:
        """Writes what the protocol has to send (the caller holds ``_lock``)."""
        for data in self._proto.data_to_send():
            try:
                if data:
                    self._sock.sendall(data)
                else:
                    self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the peer is gone; what it sent is still read

    def _read(self, timeout: float | None) -> list[Any]:
        """Reads once; queues complete messages and returns the other events."""
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(65536)
        except TimeoutError:
            raise builtins.TimeoutError("timed out") from None
        except OSError:
            data = b""
        with self._lock:
            if data:
                self._proto.receive_data(data)
            else:
                self._proto.receive_eof()
            received = self._proto.events_received()
            self._flush()
        events = []
        for event in received:
            if isinstance(event, Frame) and event.opcode in (
                Opcode.TEXT,
                Opcode.BINARY,
                Opcode.CONT,
            ):
                self._partial.append(bytes(event.data))
                if event.fin:
                    self._frames.append(b"".join(self._partial).decode())
                    self._partial = []
            else:
                events.append(event)
        return events

    def has_input(self) -> bool:
        """Whether a message, or bytes of one, can be had without waiting."""
        if self._frames:
            return True
        if self._proto.state is State.CLOSED:
            return False
        if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
            return True
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True  # a closed socket: reading it reports the end
        return bool(readable)

    def send(self, text: str) -> None:
        """Sends a text frame (raises ``ConnectionClosed`` when closed)."""
        with self._lock:
            if self._proto.state is not State.OPEN:
                raise self._closed()
            self._proto.send_text(text.encode())
            self._flush()

    def recv(self, timeout: float | None = None) -> str:
        """The next text message; ``ConnectionClosed`` at the end of the connection."""
        deadline = _deadline(timeout)
        while not self._frames:
            if self._proto.state is State.CLOSED:
                raise self._closed()
            self._read(_left(deadline))
        return self._frames.pop(0)

    def _closed(self) -> ConnectionClosed:
        p = self._proto
        return ConnectionClosed(p.close_rcvd, p.close_sent, p.close_rcvd_then_sent)

    def close(self) -> None:
        """Sends a Close (if still open) and closes the socket."""
        with self._lock:
            if self._proto.state is State.OPEN:
                try:
                    self._proto.send_close(1000)
                    self._flush()
                except Exception:
                    pass
        self._sock.close()


class _Buffered:
    """Output received but not read yet; shared by both classes."""

    def __init__(self, protocol: PtyProtocol, detach_on_exit: bool) -> None:
        self._proto = protocol
        self._buf = bytearray()
        self._eof = False
        self._detach_on_exit = detach_on_exit

    @property
    def pid(self) -> int | None:
        """Pid of the program in the sandbox."""
        return self._proto.pid

    @property
    def exit_code(self) -> int | None:
        """Exit code once the program ended (compatible protocol: 128+N after signal N)."""
        return self._proto.exit_code

    @property
    def returncode(self) -> int | None:
        """Alias of :attr:`exit_code`, as in ``subprocess``."""
        return self._proto.exit_code

    @property
    def exited(self) -> bool:
        """True once the program's exit was received."""
        return self._proto.exited

    @property
    def pty(self) -> PtyInfo | None:
        """The ``/v1`` terminal as of attaching (``None`` for the compatible protocol)."""
        return self._proto.info

    def read_available(self) -> bytes:
        """Everything received and not read yet, without waiting."""
        out = bytes(self._buf)
        self._buf.clear()
        return out

    def _take_until(self, marker: bytes) -> bytes | None:
        i = self._buf.find(marker)
        if i < 0:
            return None
        end = i + len(marker)
        out = bytes(self._buf[:end])
        del self._buf[:end]
        return out


#: Seconds :meth:`ContainerProcess.poll` waits for the rest of a message it saw begin.
_POLL_SLICE = 1.0


def _exit_status(protocol: PtyProtocol) -> int:
    """The exit code ``wait`` returns: the program's, or -1 when none was reported.

    A terminal that ended with an ``error`` frame and no exit raises
    :class:`TerminalError` (a ``RuntimeError``, as Orchard's SDK raises).
    """
    if protocol.exit_code is None and protocol.errors:
        raise TerminalError(f"terminal error: {protocol.errors[-1]}", code="pty_error")
    return protocol.exit_code if protocol.exit_code is not None else -1


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class ContainerProcess(_Buffered):
    """A program on a terminal in a sandbox, driven over a WebSocket.

    Made by ``sandbox.exec(cmd, pty=True)`` (compatible protocol) or by
    :meth:`Terminal.attach` (``/v1``, re-attachable). ``write`` types, ``read``
    returns output as it comes (``b""`` once the program has exited), ``wait`` waits for
    the exit. Leaving a ``with`` block closes the program, or for an attached ``/v1``
    terminal detaches and leaves it running.
    """

    def __init__(self, ws: SyncWebSocket, protocol: PtyProtocol, detach_on_exit: bool) -> None:
        super().__init__(protocol, detach_on_exit)
        self._ws = ws
        #: One reader at a time (``read``/``wait`` may be called from any thread, as
        #: with Orchard's reader thread); ``poll`` does not wait for it.
        self._reading = threading.RLock()

    @classmethod
    def open(
        cls,
        target: WsTarget,
        *,
        init: dict[str, Any] | None,
        timeout: float = _OPEN_TIMEOUT,
    ) -> ContainerProcess:
        """Connects; with ``init`` speaks the compatible protocol, else attaches (``/v1``)."""
        with _connecting():
            ws = SyncWebSocket(target, timeout)
        proc = cls(ws, PtyProtocol(compat=init is not None), detach_on_exit=init is None)
        try:
            if init is not None:
                ws.send(json.dumps(init))
            deadline = _deadline(timeout)
            while not proc._proto.started:
                if not proc._pump(_left(deadline)):
                    raise OrchardConnectionError("terminal closed before it started")
        except ConnectionClosed as err:
            ws.close()
            raise _closed_error(err) from err
        except BaseException:
            ws.close()
            raise
        return proc

    def _pump(self, timeout: float | None) -> bool:
        """Receives one frame; False at the end of the stream."""
        with self._reading:
            return self._pump_locked(timeout)

    def _pump_locked(self, timeout: float | None) -> bool:
        if self._eof:
            return False
        try:
            text = self._ws.recv(timeout=timeout)
        except builtins.TimeoutError:
            raise OrchardTimeoutError("no terminal output in time") from None
        except ConnectionClosed as err:
            self._eof = True
            if self._proto.exited or _is_normal_close(err):
                return False
            raise _closed_error(err) from err
        self._buf += self._proto.handle(text)
        if self._proto.exited:
            self._eof = True
        return True

    def write(self, data: str | bytes) -> None:
        """Types ``data`` (text is sent as UTF-8)."""
        self._ws.send(PtyProtocol.stdin(data))

    def write_stdin(self, data: bytes | str) -> None:
        """Orchard's name of :meth:`write`."""
        self.write(data)

    def poll(self) -> int | None:
        """The exit code if the program has exited, else ``None``; never blocks.

        Frames already sent by the server are taken in first (their output stays
        readable), so a program that has exited is seen as such.
        """
        if self._reading.acquire(blocking=False):  # else another thread is reading
            try:
                while not self._eof and self._ws.has_input():
                    self._pump_locked(_POLL_SLICE)
            except OrchardTimeoutError:
                pass
            finally:
                self._reading.release()
        return self._proto.exit_code if self._proto.exited else None

    def read_all(self, timeout: float | None = None) -> bytes:
        """All output until the program ends (at most ``timeout`` seconds in all;
        :class:`TimeoutError` after that)."""
        deadline = _deadline(timeout)
        while self._pump(_left(deadline)):
            pass
        return self.read_available()

    def kill(self, signal_name: str = "TERM") -> None:
        """Sends ``signal_name`` (``"TERM"``, ``"INT"``, ``"KILL"``...) to the program's
        process group; best effort (nothing is raised once the connection is gone)."""
        try:
            self.send_signal(signal_name)
        except (ConnectionClosed, OSError):
            pass

    def read(self, timeout: float | None = None) -> bytes:
        """The next output, waiting up to ``timeout`` seconds; ``b""`` once it has ended.

        Raises :class:`OrchardTimeoutError` when nothing came in time.
        """
        deadline = _deadline(timeout)
        while not self._buf:
            if not self._pump(_left(deadline)):
                return b""
        return self.read_available()

    def read_until(self, marker: str | bytes, timeout: float | None = None) -> bytes:
        """Output up to and including ``marker``; what follows stays unread.

        Raises :class:`OrchardTimeoutError` when ``marker`` did not come in time, and
        :class:`EOFError` when the program ended first.
        """
        needle = marker.encode() if isinstance(marker, str) else marker
        deadline = _deadline(timeout)
        while True:
            got = self._take_until(needle)
            if got is not None:
                return got
            if not self._pump(_left(deadline)):
                raise EOFError(f"terminal ended before {marker!r}")

    def wait(self, timeout: float | None = None) -> int:
        """Waits for the program to end and returns its exit code (-1 if none was
        reported); output stays readable. :class:`TimeoutError` after ``timeout``."""
        deadline = _deadline(timeout)
        while self._pump(_left(deadline)):
            pass
        return _exit_status(self._proto)

    def communicate(self, input: str | bytes | None = None, timeout: float | None = None) -> bytes:
        """Types ``input``, waits for the end, and returns all output not read yet."""
        if input:
            self.write(input)
        self.wait(timeout)
        return self.read_available()

    def __iter__(self) -> Iterator[bytes]:
        """Output chunks until the program ends."""
        while True:
            chunk = self.read()
            if not chunk:
                return
            yield chunk

    def resize(self, rows: int, cols: int) -> None:
        """Sets the window size."""
        self._ws.send(PtyProtocol.resize(rows, cols))

    def send_signal(self, sig: str | int) -> None:
        """Sends a signal (``"INT"``, ``"TERM"``, a number) to the foreground job."""
        self._ws.send(PtyProtocol.signal_frame(sig))

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the foreground job."""
        self.send_signal("INT")

    def detach(self) -> None:
        """Leaves a ``/v1`` terminal running and disconnects (``Terminal.attach`` again)."""
        self._hang_up(PtyProtocol.detach())

    def close(self) -> None:
        """Ends the program (SIGHUP, then SIGKILL) and disconnects."""
        self._hang_up(PtyProtocol.close())

    def _hang_up(self, frame: str) -> None:
        """Sends ``frame`` (detach or close) unless the program already ended, then
        disconnects."""
        if not self._eof:
            try:
                self._ws.send(frame)
            except ConnectionClosed:
                pass
        self._eof = True
        self._ws.close()

    def __enter__(self) -> ContainerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._detach_on_exit:
            self.detach()
        else:
            self.close()


class AsyncContainerProcess(_Buffered):
    """Async :class:`ContainerProcess`: the same methods, awaitable.

    A reader task takes frames in as they come (as Orchard's does), so :meth:`poll`
    sees the exit without an ``await`` of its own.

    >>> async def main(sb):
    ...     async with await sb.exec("echo hi", pty=True) as proc:
    ...         code = await proc.wait(timeout=30)
    ...         return code, proc.read_available().strip()
    >>> run_async(main, image="busybox:latest")
    (0, b'hi')
    """

    def __init__(self, ws: AsyncConnection, protocol: PtyProtocol, detach_on_exit: bool) -> None:
        super().__init__(protocol, detach_on_exit)
        self._ws = ws
        #: Set by the reader task whenever it took a frame in, or ended.
        self._arrived = asyncio.Event()
        #: Why the reader ended, to be raised by the next wait (at most once).
        self._failure: BaseException | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read_frames())

    async def _read_frames(self) -> None:
        """The reader task: frames into the buffer until the exit or the connection's end."""
        try:
            while not self._proto.exited:
                text = await self._ws.recv()
                self._buf += self._proto.handle(text)
                self._arrived.set()
        except ConnectionClosed as err:
            if not (self._proto.exited or _is_normal_close(err)):
                self._failure = _closed_error(err)
        except Exception as err:  # an error frame before the start, a bad frame
            self._failure = err
        finally:
            self._eof = True
            self._arrived.set()

    async def _stop_reader(self) -> None:
        """Waits for the reader to see the connection's end (after ``ws.close``)."""
        if self._reader.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), _OPEN_TIMEOUT)
        except builtins.TimeoutError:
            self._reader.cancel()
        except asyncio.CancelledError:
            self._reader.cancel()
            raise

    @classmethod
    async def open(
        cls,
        target: WsTarget,
        *,
        init: dict[str, Any] | None,
        timeout: float = _OPEN_TIMEOUT,
    ) -> AsyncContainerProcess:
        """Connects; with ``init`` speaks the compatible protocol, else attaches (``/v1``)."""
        kwargs: dict[str, Any] = {
            "additional_headers": target.headers,
            "open_timeout": timeout,
            "max_size": None,
            "proxy": None,
            "compression": None,
        }
        with _connecting():
            if target.uds:
                ws = await async_unix_connect(target.uds, target.url, **kwargs)
            else:
                ws = await async_connect(target.url, **kwargs)
        proc = cls(ws, PtyProtocol(compat=init is not None), detach_on_exit=init is None)
        try:
            if init is not None:
                await ws.send(json.dumps(init))
            deadline = _deadline(timeout)
            while not proc._proto.started:
                if not await proc._pump(_left(deadline)):
                    raise OrchardConnectionError("terminal closed before it started")
        except ConnectionClosed as err:
            await ws.close()
            await proc._stop_reader()
            raise _closed_error(err) from err
        except BaseException:
            await ws.close()
            await proc._stop_reader()
            raise
        return proc

    def _raise_failure(self) -> None:
        if self._failure is not None:
            err, self._failure = self._failure, None
            raise err

    async def _pump(self, timeout: float | None) -> bool:
        """Waits until the reader took a frame in; False once nothing more can come."""
        self._raise_failure()
        if self._eof:
            return False
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), timeout)
        except builtins.TimeoutError:
            raise OrchardTimeoutError("no terminal output in time") from None
        self._raise_failure()
        return True

    @classmethod
    async def connect(
        cls,
        ws_url: str,
        init_frame: str | Mapping[str, Any],
        *,
        connect_timeout: float = 10.0,
        session: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncContainerProcess:
        """Connects to a compatible PTY WebSocket (``ws://.../sandboxes/{id}/exec/pty?api_key=K``)
        and starts the program of ``init_frame`` (JSON text or a dict), as Orchard's
        ``AsyncContainerProcess.connect`` does. ``session`` is accepted for
        compatibility and not used (the connection is the ``websockets`` library's)."""
        del session
        init = json.loads(init_frame) if isinstance(init_frame, str) else dict(init_frame)
        target = WsTarget(ws_url, dict(headers or {}))
        return await cls.open(target, init=init, timeout=connect_timeout)

    async def write(self, data: str | bytes) -> None:
        """Types ``data``."""
        await self._ws.send(PtyProtocol.stdin(data))

    async def write_stdin(self, data: bytes | str) -> None:
        """Orchard's name of :meth:`write`."""
        await self.write(data)

    def poll(self) -> int | None:
        """The exit code if the program has exited, else ``None`` (not a coroutine, as in
        Orchard's SDK: the reader task keeps the state current)."""
        return self._proto.exit_code if self._proto.exited else None

    async def read_all(self, timeout: float | None = None) -> bytes:
        """All output until the program ends (:class:`TimeoutError` after ``timeout``)."""
        deadline = _deadline(timeout)
        while await self._pump(_left(deadline)):
            pass
        return self.read_available()

    async def kill(self, signal_name: str = "TERM") -> None:
        """Sends ``signal_name`` to the program's process group; best effort."""
        try:
            await self.send_signal(signal_name)
        except (ConnectionClosed, OSError):
            pass

    async def read(self, timeout: float | None = None) -> bytes:
        """The next output; ``b""`` once it has ended (see :meth:`ContainerProcess.read`)."""
        deadline = _deadline(timeout)
        while not self._buf:
            if not await self._pump(_left(deadline)):
                return b""
        return self.read_available()

    async def read_until(self, marker: str | bytes, timeout: float | None = None) -> bytes:
        """Output up to and including ``marker`` (see :meth:`ContainerProcess.read_until`)."""
        needle = marker.encode() if isinstance(marker, str) else marker
        deadline = _deadline(timeout)
        while True:
            got = self._take_until(needle)
            if got is not None:
                return got
            if not await self._pump(_left(deadline)):
                raise EOFError(f"terminal ended before {marker!r}")

    async def wait(self, timeout: float | None = None) -> int:
        """Waits for the program to end and returns its exit code (-1 if none was reported)."""
        deadline = _deadline(timeout)
        while await self._pump(_left(deadline)):
            pass
        return _exit_status(self._proto)

    async def communicate(
        self, input: str | bytes | None = None, timeout: float | None = None
    ) -> bytes:
        """Types ``input``, waits for the end, and returns all output not read yet."""
        if input:
            await self.write(input)
        await self.wait(timeout)
        return self.read_available()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """Output chunks until the program ends."""
        while True:
            chunk = await self.read()
            if not chunk:
                return
            yield chunk

    async def resize(self, rows: int, cols: int) -> None:
        """Sets the window size."""
        await self._ws.send(PtyProtocol.resize(rows, cols))

    async def send_signal(self, sig: str | int) -> None:
        """Sends a signal to the foreground job."""
        await self._ws.send(PtyProtocol.signal_frame(sig))

    async def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the foreground job."""
        await self.send_signal("INT")

    async def detach(self) -> None:
        """Leaves a ``/v1`` terminal running and disconnects."""
        await self._hang_up(PtyProtocol.detach())

    async def close(self) -> None:
        """Ends the program and disconnects."""
        await self._hang_up(PtyProtocol.close())

    async def _hang_up(self, frame: str) -> None:
        """Sends ``frame`` (detach or close) unless the program already ended, then
        disconnects and stops the reader task."""
        if not self._eof:
            try:
                await self._ws.send(frame)
            except ConnectionClosed:
                pass
        self._eof = True
        await self._ws.close()
        await self._stop_reader()

    async def __aenter__(self) -> AsyncContainerProcess:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._detach_on_exit:
            await self.detach()
        else:
            await self.close()

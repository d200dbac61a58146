"""Shared pieces of the streamed routes: NDJSON decoding, exec events, tar streams."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import tarfile
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import IO, Any, Literal

from .errors import OrchardError, error_from_body
from .models import ExecEvent, ExecExit, ExecOutput, ExecStart

#: Chunk size of streamed uploads.
CHUNK = 256 * 1024

_STATUS_OF_CODE = {
    "invalid_json": 400,
    "invalid_argument": 400,
    "no_shell": 400,
    "command_not_found": 400,
    "cwd_not_found": 400,
    "not_found": 404,
    "too_many_execs": 429,
    "spawn_failed": 500,
    "internal": 500,
    "shutting_down": 503,
}


class NdjsonDecoder:
    """Splits a byte stream into JSON objects, one per line.

    >>> d = NdjsonDecoder()
    >>> d.feed(b'{"a": 1}\\n{"b"') + d.feed(b': 2}\\n')
    [{'a': 1}, {'b': 2}]
    """

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[Any]:
        """Adds ``chunk`` and returns the complete objects it finished."""
        self._buf += chunk
        if b"\n" not in self._buf:
            return []
        *lines, self._buf = self._buf.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def end(self) -> list[Any]:
        """The last object when the stream did not end with a newline."""
        rest, self._buf = self._buf, b""
        return [json.loads(rest)] if rest.strip() else []


def exec_event(frame: dict[str, Any]) -> ExecEvent | None:
    """The event of one ``/exec/stream`` frame; ``None`` for keep-alives.

    An ``error`` frame raises the SDK exception of its code.

    >>> exec_event({"type": "stdout", "data": "aGk="})
    ExecOutput(stream='stdout', data=b'hi')
    >>> exec_event({"type": "keepalive"}) is None
    True
    """
    kind = frame.get("type")
    if kind in ("stdout", "stderr"):
        return ExecOutput(kind, base64.b64decode(frame.get("data", "")))
    if kind == "start":
        return ExecStart(int(frame.get("pid", 0)))
    if kind == "exit":
        return ExecExit(
            exit_code=frame.get("exit_code"),
            signal=frame.get("signal"),
            timed_out=bool(frame.get("timed_out", False)),
            duration_ms=float(frame.get("duration_ms", 0.0)),
            stdout_bytes=int(frame.get("stdout_bytes", 0)),
            stderr_bytes=int(frame.get("stderr_bytes", 0)),
        )
    if kind == "error":
        code = str(frame.get("code", "internal"))
        body = json.dumps({"code": code, "message": frame.get("message", "")}).encode()
        raise error_from_body(_STATUS_OF_CODE.get(code, 500), body)
    return None


class ExecDecoder:
    """The events of an ``/exec/stream`` body, chunk by chunk: keep-alives left out, an
    ``error`` frame raised (after the events before it)."""

    def __init__(self) -> None:
        self._frames = NdjsonDecoder()

    def feed(self, chunk: bytes) -> Iterator[ExecEvent]:
        """The events that ``chunk`` completes."""
        return self._events(self._frames.feed(chunk))

    def end(self) -> Iterator[ExecEvent]:
        """The last event when the body did not end with a newline."""
        return self._events(self._frames.end())

    @staticmethod
    def _events(frames: list[Any]) -> Iterator[ExecEvent]:
        for frame in frames:
            event = exec_event(frame)
            if event is not None:
                yield event


def pull_event(frame: dict[str, Any]) -> dict[str, Any]:
    """A frame of ``/v1/images/pull``; an ``error`` frame raises."""
    if frame.get("type") == "error":
        raise OrchardError(str(frame.get("detail", "pull failed")), code="pull_failed")
    return frame


# --- bodies ---------------------------------------------------------------------------

Body = bytes | Iterator[bytes]


def body_from(source: Any) -> tuple[Any, bool]:
    """Turns what a caller may upload into an httpx body, and whether it can be resent.

    Accepts ``bytes``/``str`` (resendable), a binary file object (read in chunks), or an
    iterable of ``bytes`` (sync or async).
    """
    if isinstance(source, str):
        return source.encode(), True
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), True
    if hasattr(source, "read"):
        return file_chunks(source), False
    if isinstance(source, (Iterable, AsyncIterable)):
        return source, False
    raise TypeError(f"cannot upload a {type(source).__name__}")


def file_chunks(f: IO[bytes], size: int = CHUNK) -> Iterator[bytes]:
    """Reads a binary file object in chunks."""
    while True:
        chunk = f.read(size)
        if not chunk:
            return
        yield chunk


def path_chunks(path: str | os.PathLike[str], size: int = CHUNK) -> Iterator[bytes]:
    """Reads a local file in chunks, opening it only when the first chunk is wanted."""
    with open(path, "rb") as f:
        yield from file_chunks(f, size)


def upload_source(source: Any, *, directories: bool = False) -> tuple[Any, bool]:
    """Like :func:`body_from`, but a ``str`` or ``PathLike`` is a local path: a file, read
    in chunks, or (with ``directories``) a directory, tarred on the fly."""
    if isinstance(source, (str, os.PathLike)):
        if directories and os.path.isdir(source):
            return tar_directory(source), False
        return path_chunks(source), False
    return body_from(source)


def file_sink(
    dest: str | os.PathLike[str] | IO[bytes],
) -> contextlib.AbstractContextManager[IO[bytes]]:
    """Where to write a download: a path, opened (and closed when done), or a binary file
    object, as it is (left open)."""
    if isinstance(dest, (str, os.PathLike)):
        return open(dest, "wb")
    return contextlib.nullcontext(dest)


async def to_async(chunks: Any) -> AsyncIterator[bytes]:
    """An async iterator over a sync or async iterable of bytes (for ``httpx.AsyncClient``)."""
    if isinstance(chunks, AsyncIterable):
        async for c in chunks:
            yield c
    else:
        for c in chunks:
            yield c


def async_body(content: Any) -> Any:
    """``content`` made acceptable to ``httpx.AsyncClient`` (bytes stay bytes)."""
    if content is None or isinstance(content, bytes):
        return content
    return to_async(content)


def sync_body(content: Any) -> Any:
    """``content`` as ``httpx.Client`` takes it: unchanged (the twin of :func:`async_body`,
    for the generated sync client)."""
    return content


def tar_directory(local_dir: str | os.PathLike[str], size: int = CHUNK) -> Iterator[bytes]:
    """A tar of the contents of ``local_dir`` (names relative to it), streamed in chunks.

    Nothing is built in memory or on disk: headers come from ``tarfile``, file contents
    are read chunk by chunk.

    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp(); _ = pathlib.Path(d, "a.txt").write_text("hi")
    >>> tf = tarfile.open(fileobj=io.BytesIO(b"".join(tar_directory(d))))
    >>> tf.getnames(), tf.extractfile("a.txt").read()
    (['a.txt'], b'hi')
    """
    root = os.fspath(local_dir)
    if not os.path.isdir(root):
        raise NotADirectoryError(root)
    fmt: Literal[0, 1, 2] = tarfile.PAX_FORMAT
    helper = tarfile.TarFile(fileobj=io.BytesIO(), mode="w", format=fmt)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        names = sorted(dirnames) + sorted(filenames)
        for name in names:
            full = os.path.join(dirpath, name)
            arcname = os.path.relpath(full, root)
            info = helper.gettarinfo(full, arcname)
            if info.isdir() and os.path.islink(full):
                continue
            if not (info.isfile() or info.isdir() or info.issym()):
                continue
            yield info.tobuf(fmt, tarfile.ENCODING, "surrogateescape")
            if info.isfile():
                with open(full, "rb") as f:
                    remaining = info.size
                    while remaining > 0:
                        chunk = f.read(min(size, remaining))
                        if not chunk:
                            raise OSError(f"{full} shrank while being uploaded")
                        remaining -= len(chunk)
                        yield chunk
                pad = (-info.size) % tarfile.BLOCKSIZE
                if pad:
                    yield b"\0" * pad
    yield b"\0" * (tarfile.BLOCKSIZE * 2)


class IterReader(io.RawIOBase):
    """A read-only file object over an iterator of byte chunks (for ``tarfile`` streams)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def extract_tar(
    fileobj: IO[bytes], dest: str | os.PathLike[str], strip_root: str | None = None
) -> list[str]:
    """Extracts a tar(.gz) stream into ``dest`` with the ``data`` filter (no escapes).

    With ``strip_root``, a top directory of that name is dropped, so that its contents
    land in ``dest`` itself (the agent's archive of ``/a/b`` holds ``b/...``).
    """
    os.makedirs(dest, exist_ok=True)
    names: list[str] = []
    with tarfile.open(fileobj=fileobj, mode="r|*") as tf:
        for member in tf:
            name = member.name.rstrip("/")
            if strip_root:
                if name == strip_root and member.isdir():
                    continue
                if name.startswith(strip_root + "/"):
                    member.name = name[len(strip_root) + 1 :]
            tf.extract(member, dest, filter="data")
            names.append(member.name)
    return names


def archive_root(remote_path: str) -> str:
    """The top name in the agent's archive of ``remote_path``."""
    return remote_path.rstrip("/").rsplit("/", 1)[-1]

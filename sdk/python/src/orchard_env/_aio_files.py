"""Files through the ``/v1`` agent API: :class:`AsyncSandboxFiles`, a base of
:class:`~orchard_env.AsyncSandboxInstance` (streamed reads and writes, metadata, tar
archives both ways)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import IO

from . import _ops
from ._aio_core import AsyncSandboxCore
from ._aio_only import extract_tar_stream
from ._streams import (
    archive_root,
    async_body,
    body_from,
    file_sink,
    path_chunks,
    tar_directory,
    upload_source,
)
from .models import ExtractResult, FileStat


class AsyncSandboxFiles(AsyncSandboxCore):
    """The ``/v1`` file methods of :class:`~orchard_env.AsyncSandboxInstance`."""

    async def write_file(
        self,
        path: str,
        data: bytes | str | IO[bytes] | Iterable[bytes] | AsyncIterable[bytes],
        *,
        mode: int | str | None = None,
        parents: bool = True,
    ) -> int:
        """Writes ``data`` to ``path``, streamed and atomically; returns the size."""
        content, replayable = body_from(data)
        op = _ops.write_file(
            path, async_body(content), replayable=replayable, mode=mode, parents=parents
        )
        return await self._run(op)

    async def read_file(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> bytes:
        """The bytes of ``path`` (or ``length`` bytes from ``offset``)."""
        return await self._run(_ops.read_file(path, offset, length))

    async def iter_file(self, path: str, *, chunk_size: int = 256 * 1024) -> AsyncIterator[bytes]:
        """The bytes of ``path`` as an async stream of chunks (nothing held in memory)."""
        route = await self._route()
        async with self._driver.stream(_ops.read_file_request(path), route) as response:
            async for chunk in response.aiter_bytes(chunk_size):
                yield chunk

    async def upload_path(
        self, local: str | os.PathLike[str], remote: str, *, mode: int | None = None
    ) -> int:
        """Streams the local file ``local`` to ``remote``; returns the size."""
        op = _ops.write_file(
            remote, async_body(path_chunks(local)), replayable=False, mode=mode, parents=True
        )
        return await self._run(op)

    async def download_path(self, remote: str, local: str | os.PathLike[str]) -> int:
        """Streams the file ``remote`` into ``local``; returns the size."""
        size = 0
        with open(local, "wb") as f:
            async for chunk in self.iter_file(remote):
                f.write(chunk)
                size += len(chunk)
        return size

    async def stat(self, path: str) -> FileStat:
        """Metadata of ``path`` (links are not followed)."""
        return await self._run(_ops.stat(path))

    async def list_dir(self, path: str, *, depth: int = 1) -> list[FileStat]:
        """Entries of a directory, ``depth`` levels deep."""
        return await self._run(_ops.list_dir(path, depth))

    async def mkdir(self, path: str, *, mode: int | None = None) -> None:
        """Creates a directory and its missing parents."""
        await self._run(_ops.mkdir(path, mode))

    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> None:
        """Moves or renames ``src`` to ``dst``."""
        await self._run(_ops.move(src, dst, overwrite))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, link, or (with ``recursive``) a directory tree."""
        await self._run(_ops.remove(path, recursive))

    async def upload_tar(
        self,
        archive: bytes
        | str
        | os.PathLike[str]
        | IO[bytes]
        | Iterable[bytes]
        | AsyncIterable[bytes],
        remote_dir: str,
    ) -> ExtractResult:
        """Extracts a tar or tar.gz (bytes, a path to one, a file object or chunks) into
        ``remote_dir``, all or nothing."""
        content, replayable = upload_source(archive)
        op = _ops.upload_tar(remote_dir, async_body(content), replayable=replayable)
        return await self._run(op)

    async def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> ExtractResult:
        """Copies the contents of the local directory into ``remote_dir``."""
        op = _ops.upload_tar(remote_dir, async_body(tar_directory(local_dir)), replayable=False)
        return await self._run(op)

    async def download_tar(self, remote_path: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Saves ``remote_path`` (a file or a directory) as a tar.gz into ``dest`` (a path or
        a binary file object); returns the archive's size."""
        size = 0
        route = await self._route()
        async with self._driver.stream(_ops.download_tar_request(remote_path), route) as response:
            with file_sink(dest) as f:
                async for chunk in response.aiter_bytes():
                    f.write(chunk)
                    size += len(chunk)
        return size

    async def download_dir(self, remote_path: str, local_dir: str | os.PathLike[str]) -> list[str]:
        """Copies the contents of ``remote_path`` into ``local_dir`` (see
        :meth:`SandboxInstance.download_dir`)."""
        request = _ops.download_tar_request(remote_path)
        route = await self._route()
        return await extract_tar_stream(
            self._driver, request, route, local_dir, archive_root(remote_path)
        )

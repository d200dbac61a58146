"""Files of a sandbox, through ``/v1``: the methods :class:`AsyncSandboxInstance` has
from :class:`AsyncFileOps` (streamed both ways, nothing held in memory)."""

from __future__ import annotations

# unasync: async
# _sync_files.py is generated from this module by scripts/unasync.py: edit here, then run it.
# unasync: end
# unasync: async
import os
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Iterable

# unasync: sync
# import os
# from collections.abc import Iterable, Iterator
#
# from ._streams import IterReader
# unasync: end
from typing import IO, TYPE_CHECKING, Any

from . import _ops
from ._streams import (
    archive_root,
    async_body,
    body_from,
    extract_tar,
    path_chunks,
    tar_directory,
)
from .models import ExtractResult, FileStat

if TYPE_CHECKING:
    from ._http import AsyncDriver, Op, Route


class AsyncFileOps:
    """Reading, writing, listing and moving files, and whole directories as tar streams
    (a part of :class:`AsyncSandboxInstance`)."""

    if TYPE_CHECKING:
        _driver: AsyncDriver

        async def _run(self, op: Op[Any]) -> Any: ...

        async def _route(self) -> Route: ...

    # --- /v1: files --------------------------------------------------------------------------

    async def write_file(
        self,
        path: str,
        data: bytes | str | IO[bytes] | Iterable[bytes] | AsyncIterable[bytes],
        *,
        mode: int | str | None = None,
        parents: bool = True,
    ) -> int:
        # unasync: async
        """Writes ``data`` to ``path``, streamed and atomically; returns the size."""
        # unasync: sync
        # """Writes ``data`` (bytes, text, a binary file object or an iterable of chunks) to
        # ``path``, streamed and atomically; returns the size written.
        #
        # >>> sandbox.write_file("/tmp/a/b.txt", b"data", mode=0o600)
        # 4
        # >>> sandbox.read_file("/tmp/a/b.txt"), oct(sandbox.stat("/tmp/a/b.txt").mode)
        # (b'data', '0o600')
        # """
        # unasync: end
        content, replayable = body_from(data)
        result: int = await self._run(
            _ops.write_file(
                path, async_body(content), replayable=replayable, mode=mode, parents=parents
            )
        )
        return result

    async def read_file(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> bytes:
        """The bytes of ``path`` (or ``length`` bytes from ``offset``)."""
        result: bytes = await self._run(_ops.read_file(path, offset, length))
        return result

    async def iter_file(self, path: str, *, chunk_size: int = 256 * 1024) -> AsyncIterator[bytes]:
        # unasync: async
        """The bytes of ``path`` as an async stream of chunks (nothing held in memory)."""
        route = await self._route()
        async with self._driver.stream(_ops.read_file_request(path), route) as response:
            async for chunk in response.aiter_bytes(chunk_size):
                yield chunk
        # unasync: sync
        # """The bytes of ``path`` as a stream of chunks (nothing held in memory)."""
        # with self._driver.stream(_ops.read_file_request(path), self._route()) as response:
        #     yield from response.iter_bytes(chunk_size)
        # unasync: end

    async def upload_path(
        self, local: str | os.PathLike[str], remote: str, *, mode: int | None = None
    ) -> int:
        """Streams the local file ``local`` to ``remote``; returns the size."""
        op = _ops.write_file(
            remote, async_body(path_chunks(local)), replayable=False, mode=mode, parents=True
        )
        result: int = await self._run(op)
        return result

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
        result: FileStat = await self._run(_ops.stat(path))
        return result

    async def list_dir(self, path: str, *, depth: int = 1) -> list[FileStat]:
        """Entries of a directory, ``depth`` levels deep."""
        result: list[FileStat] = await self._run(_ops.list_dir(path, depth))
        return result

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
        if isinstance(archive, (str, os.PathLike)):
            content, replayable = path_chunks(archive), False
        else:
            content, replayable = body_from(archive)
        op = _ops.upload_tar(remote_dir, async_body(content), replayable=replayable)
        result: ExtractResult = await self._run(op)
        return result

    async def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> ExtractResult:
        # unasync: async
        """Copies the contents of the local directory into ``remote_dir``."""
        # unasync: sync
        # """Copies the contents of the local directory into ``remote_dir`` (a streamed tar).
        #
        # >>> import tempfile, pathlib
        # >>> d = tempfile.mkdtemp(); _ = pathlib.Path(d, "x.txt").write_text("x")
        # >>> sandbox.upload_dir(d, "/tmp/up").entries
        # 1
        # """
        # unasync: end
        op = _ops.upload_tar(remote_dir, async_body(tar_directory(local_dir)), replayable=False)
        result: ExtractResult = await self._run(op)
        return result

    async def download_tar(self, remote_path: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Saves ``remote_path`` (a file or a directory) as a tar.gz into ``dest`` (a path or
        a binary file object); returns the archive's size."""
        size = 0
        route = await self._route()
        async with self._driver.stream(_ops.download_tar_request(remote_path), route) as response:
            if isinstance(dest, (str, os.PathLike)):
                with open(dest, "wb") as f:
                    async for chunk in response.aiter_bytes():
                        f.write(chunk)
                        size += len(chunk)
            else:
                async for chunk in response.aiter_bytes():
                    dest.write(chunk)
                    size += len(chunk)
        return size

    async def download_dir(self, remote_path: str, local_dir: str | os.PathLike[str]) -> list[str]:
        # unasync: async
        """Copies the contents of ``remote_path`` into ``local_dir`` (see
        :meth:`SandboxInstance.download_dir`)."""
        with tempfile.TemporaryFile() as spool:
            await self.download_tar(remote_path, spool)
            spool.seek(0)
            return extract_tar(spool, local_dir, archive_root(remote_path))
        # unasync: sync
        # """Copies the contents of the directory ``remote_path`` (or the file itself) into
        # ``local_dir``, streamed, as :meth:`upload_dir` does the other way; entries that
        # would land outside it are refused. Returns the extracted names."""
        # route = self._route()
        # with self._driver.stream(_ops.download_tar_request(remote_path), route) as response:
        #     reader = IterReader(response.iter_bytes())
        #     return extract_tar(reader, local_dir, archive_root(remote_path))  # type: ignore[arg-type]
        # unasync: end

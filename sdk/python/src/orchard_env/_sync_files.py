# generated from _aio_files.py by scripts/unasync.py; do not edit
"""Files through the ``/v1`` agent API: :class:`SandboxFiles`, a base of
:class:`~orchard_env.SandboxInstance` (streamed reads and writes, metadata, tar
archives both ways)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import IO

from . import _ops
from ._streams import (
    archive_root,
    body_from,
    file_sink,
    path_chunks,
    sync_body,
    tar_directory,
    upload_source,
)
from ._sync_core import SandboxCore
from ._sync_only import extract_tar_stream
from .models import ExtractResult, FileStat


class SandboxFiles(SandboxCore):
    """The ``/v1`` file methods of :class:`~orchard_env.SandboxInstance`."""

    def write_file(
        self,
        path: str,
        data: bytes | str | IO[bytes] | Iterable[bytes],
        *,
        mode: int | str | None = None,
        parents: bool = True,
    ) -> int:
        """Writes ``data`` (bytes, text, a binary file object or an iterable of chunks) to
        ``path``, streamed and atomically; returns the size written.

        >>> sandbox.write_file("/tmp/a/b.txt", b"data", mode=0o600)
        4
        >>> sandbox.read_file("/tmp/a/b.txt"), oct(sandbox.stat("/tmp/a/b.txt").mode)
        (b'data', '0o600')
        """
        content, replayable = body_from(data)
        op = _ops.write_file(
            path, sync_body(content), replayable=replayable, mode=mode, parents=parents
        )
        return self._run(op)

    def read_file(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> bytes:
        """The bytes of ``path`` (or ``length`` bytes from ``offset``)."""
        return self._run(_ops.read_file(path, offset, length))

    def iter_file(self, path: str, *, chunk_size: int = 256 * 1024) -> Iterator[bytes]:
        """The bytes of ``path`` as a stream of chunks (nothing held in memory)."""
        route = self._route()
        with self._driver.stream(_ops.read_file_request(path), route) as response:
            yield from response.iter_bytes(chunk_size)

    def upload_path(
        self, local: str | os.PathLike[str], remote: str, *, mode: int | None = None
    ) -> int:
        """Streams the local file ``local`` to ``remote``; returns the size."""
        op = _ops.write_file(
            remote, sync_body(path_chunks(local)), replayable=False, mode=mode, parents=True
        )
        return self._run(op)

    def download_path(self, remote: str, local: str | os.PathLike[str]) -> int:
        """Streams the file ``remote`` into ``local``; returns the size."""
        size = 0
        with open(local, "wb") as f:
            for chunk in self.iter_file(remote):
                f.write(chunk)
                size += len(chunk)
        return size

    def stat(self, path: str) -> FileStat:
        """Metadata of ``path`` (links are not followed)."""
        return self._run(_ops.stat(path))

    def list_dir(self, path: str, *, depth: int = 1) -> list[FileStat]:
        """Entries of a directory, ``depth`` levels deep."""
        return self._run(_ops.list_dir(path, depth))

    def mkdir(self, path: str, *, mode: int | None = None) -> None:
        """Creates a directory and its missing parents."""
        self._run(_ops.mkdir(path, mode))

    def move(self, src: str, dst: str, *, overwrite: bool = False) -> None:
        """Moves or renames ``src`` to ``dst``."""
        self._run(_ops.move(src, dst, overwrite))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, link, or (with ``recursive``) a directory tree."""
        self._run(_ops.remove(path, recursive))

    def upload_tar(
        self,
        archive: bytes | str | os.PathLike[str] | IO[bytes] | Iterable[bytes],
        remote_dir: str,
    ) -> ExtractResult:
        """Extracts a tar or tar.gz (bytes, a path to one, a file object or chunks) into
        ``remote_dir``, all or nothing."""
        content, replayable = upload_source(archive)
        op = _ops.upload_tar(remote_dir, sync_body(content), replayable=replayable)
        return self._run(op)

    def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> ExtractResult:
        """Copies the contents of the local directory into ``remote_dir`` (a streamed tar).

        >>> import tempfile, pathlib
        >>> d = tempfile.mkdtemp(); _ = pathlib.Path(d, "x.txt").write_text("x")
        >>> sandbox.upload_dir(d, "/tmp/up").entries
        1
        """
        op = _ops.upload_tar(remote_dir, sync_body(tar_directory(local_dir)), replayable=False)
        return self._run(op)

    def download_tar(self, remote_path: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Saves ``remote_path`` (a file or a directory) as a tar.gz into ``dest`` (a path or
        a binary file object); returns the archive's size."""
        size = 0
        route = self._route()
        with self._driver.stream(_ops.download_tar_request(remote_path), route) as response:
            with file_sink(dest) as f:
                for chunk in response.iter_bytes():
                    f.write(chunk)
                    size += len(chunk)
        return size

    def download_dir(self, remote_path: str, local_dir: str | os.PathLike[str]) -> list[str]:
        """Copies the contents of the directory ``remote_path`` (or the file itself) into
        ``local_dir``, streamed, as :meth:`upload_dir` does the other way; entries that
        would land outside it are refused. Returns the extracted names."""
        request = _ops.download_tar_request(remote_path)
        route = self._route()
        return extract_tar_stream(
            self._driver, request, route, local_dir, archive_root(remote_path)
        )

# generated from _aio_images.py by scripts/unasync.py; do not edit
"""The server's image store: :class:`ClientImages`, a base of
:class:`~orchard_env.SandboxClient`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, Any

from . import _ops
from ._streams import NdjsonDecoder, pull_event, sync_body, upload_source
from ._sync_core import ClientCore
from .errors import OrchardError
from .models import ImageInfo


class ClientImages(ClientCore):
    """The image methods of :class:`~orchard_env.SandboxClient`."""

    def list_images(self) -> list[ImageInfo]:
        """Images in the server's store."""
        return self._driver.run(_ops.list_images())

    def import_image(
        self, source: str | os.PathLike[str] | bytes | IO[bytes], name: str
    ) -> list[ImageInfo]:
        """Imports an image archive under ``name``, streamed.

        ``source`` is a ``docker save`` or OCI-layout tar (optionally compressed): a
        path to the archive, a path to an OCI layout *directory* (tarred on the fly),
        its bytes, or a binary file object.
        """
        content, replayable = upload_source(source, directories=True)
        op = _ops.import_image(name, sync_body(content), replayable=replayable)
        return self._driver.run(op)

    def pull_image(
        self, reference: str, on_progress: Callable[[dict[str, Any]], None] | None = None
    ) -> ImageInfo:
        """Pulls ``reference`` into the server's store; ``on_progress`` gets each progress frame."""
        decoder = NdjsonDecoder()
        with self._driver.stream(_ops.pull_image_request(reference)) as response:
            for chunk in response.iter_bytes():
                for frame in decoder.feed(chunk):
                    event = pull_event(frame)
                    if event.get("type") == "done":
                        return ImageInfo.from_json(event.get("image") or {})
                    if on_progress is not None:
                        on_progress(event)
        raise OrchardError(f"pull of {reference} ended without a result")

    def delete_image(self, reference: str) -> dict[str, Any]:
        """Removes an image from the server's store."""
        return self._driver.run(_ops.delete_image(reference))

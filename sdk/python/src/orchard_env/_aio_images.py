"""The server's image store: :class:`AsyncClientImages`, a base of
:class:`~orchard_env.AsyncSandboxClient`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, Any

from . import _ops
from ._aio_core import AsyncClientCore
from ._streams import NdjsonDecoder, async_body, pull_event, upload_source
from .errors import OrchardError
from .models import ImageInfo


class AsyncClientImages(AsyncClientCore):
    """The image methods of :class:`~orchard_env.AsyncSandboxClient`."""

    async def list_images(self) -> list[ImageInfo]:
        """Images in the server's store."""
        return await self._driver.run(_ops.list_images())

    async def import_image(
        self, source: str | os.PathLike[str] | bytes | IO[bytes], name: str
    ) -> list[ImageInfo]:
        """Imports an image archive under ``name``, streamed.

        ``source`` is a ``docker save`` or OCI-layout tar (optionally compressed): a
        path to the archive, a path to an OCI layout *directory* (tarred on the fly),
        its bytes, or a binary file object.
        """
        content, replayable = upload_source(source, directories=True)
        op = _ops.import_image(name, async_body(content), replayable=replayable)
        return await self._driver.run(op)

    async def pull_image(
        self, reference: str, on_progress: Callable[[dict[str, Any]], None] | None = None
    ) -> ImageInfo:
        """Pulls ``reference`` into the server's store; ``on_progress`` gets each progress frame."""
        decoder = NdjsonDecoder()
        async with self._driver.stream(_ops.pull_image_request(reference)) as response:
            async for chunk in response.aiter_bytes():
                for frame in decoder.feed(chunk):
                    event = pull_event(frame)
                    if event.get("type") == "done":
                        return ImageInfo.from_json(event.get("image") or {})
                    if on_progress is not None:
                        on_progress(event)
        raise OrchardError(f"pull of {reference} ended without a result")

    async def delete_image(self, reference: str) -> dict[str, Any]:
        """Removes an image from the server's store."""
        return await self._driver.run(_ops.delete_image(reference))

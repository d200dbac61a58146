"""What only the asyncio client does: the pieces it does its own way, written by hand.

Everywhere else the two clients differ in names alone, and the sync modules are
generated from the async ones by ``scripts/unasync.py``. Here they differ in kind: a
task where the sync client has a thread, ``asyncio.gather`` where it has a loop, an
iterator object where it has a generator, a spool file where it reads a stream as it
comes. ``_sync_only`` is the twin, also written by hand, with the same names (without
``Async``), so that the generated modules import it in place of this one.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Self, TypeVar

from . import _ops
from ._aio_core import AsyncSandboxCore
from ._http import AsyncDriver, Request, Route
from ._streams import extract_tar
from .models import ExecEvent

_T = TypeVar("_T")


async def for_each(call: Callable[[_T], Awaitable[Any]], items: Iterable[_T]) -> None:
    """Calls ``call`` on every item, concurrently."""
    await asyncio.gather(*(call(item) for item in items))


async def extract_tar_stream(
    driver: AsyncDriver,
    request: Request,
    route: Route,
    local_dir: str | os.PathLike[str],
    root: str,
) -> list[str]:
    """Extracts the tar(.gz) answered to ``request`` into ``local_dir`` (see
    :func:`~orchard_env._streams.extract_tar`); returns the extracted names.

    The archive is spooled to a temporary file first: ``tarfile`` reads synchronously.
    """
    with tempfile.TemporaryFile() as spool:
        async with driver.stream(request, route) as response:
            async for chunk in response.aiter_bytes():
                spool.write(chunk)
        spool.seek(0)
        return extract_tar(spool, local_dir, root)


class AsyncExecIteration:
    """How an :class:`~orchard_env.AsyncExecStream` is iterated: it is its own async
    iterator (``anext()`` works on it), over one run of its ``_events``. Leaving an
    ``async for`` early leaves the stream open until ``aclose`` (``async with`` does it)."""

    _iterator: AsyncIterator[ExecEvent] | None = None

    # Supplied by AsyncExecStream, the class this one is mixed into.
    _events: Callable[[], AsyncIterator[ExecEvent]]

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ExecEvent:
        if self._iterator is None:
            self._iterator = self._events()
        return await self._iterator.__anext__()


class AsyncHeartbeats(AsyncSandboxCore):
    """The heartbeats of an :class:`~orchard_env.AsyncSandboxInstance`, from a task."""

    _heartbeat_task: asyncio.Task[None] | None = None

    def start_heartbeat(self, interval: float = 60) -> None:
        """Posts a heartbeat every ``interval`` seconds from an asyncio task (of the
        running loop), until :meth:`stop_heartbeat`, :meth:`delete` or the client's
        close. Not a coroutine,
        as in Orchard's SDK; failed heartbeats are ignored."""
        if self._heartbeat_task is not None and not self._heartbeat_task.done():
            return

        async def beat() -> None:
            while True:
                await asyncio.sleep(interval)
                if self._client._closed:
                    return  # its connections are gone
                try:
                    await self._driver.run(_ops.heartbeat(self.sandbox_id))
                except Exception:  # best effort, as in Orchard's SDK
                    pass

        self._heartbeat_task = asyncio.get_running_loop().create_task(
            beat(), name=f"heartbeat-{self.sandbox_id}"
        )

    def stop_heartbeat(self) -> None:
        """Cancels the heartbeat task."""
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None and not task.done():
            try:
                task.cancel()
            except RuntimeError:
                pass  # its event loop is closed (delete_sync at exit): nothing runs it

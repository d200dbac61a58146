"""What only the sync client does: the pieces it does its own way, written by hand.

The twin of ``_aio_only`` (see there), with the same names without ``Async``: the
generated sync modules import these where the async ones import those. A thread where
the async client has a task, a loop where it gathers, a generator where it has an
iterator object, a stream read as it comes where it spools to a file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from . import _ops
from ._http import Request, Route, SyncDriver
from ._streams import IterReader, extract_tar
from ._sync_core import SandboxCore
from .models import ExecEvent

_T = TypeVar("_T")


def for_each(call: Callable[[_T], Any], items: Iterable[_T]) -> None:
    """Calls ``call`` on every item, one after the other."""
    for item in items:
        call(item)


def extract_tar_stream(
    driver: SyncDriver,
    request: Request,
    route: Route,
    local_dir: str | os.PathLike[str],
    root: str,
) -> list[str]:
    """Extracts the tar(.gz) answered to ``request`` into ``local_dir`` (see
    :func:`~orchard_env._streams.extract_tar`) as it arrives; returns the extracted names.
    """
    with driver.stream(request, route) as response:
        reader = IterReader(response.iter_bytes())
        return extract_tar(reader, local_dir, root)  # type: ignore[arg-type]


class ExecIteration:
    """How an :class:`~orchard_env.ExecStream` is iterated: each ``for`` runs a generator
    over its ``_events``, so that leaving the loop early closes the stream at once (and,
    with ``kill_on_disconnect``, kills the command)."""

    # Supplied by ExecStream, the class this one is mixed into.
    _events: Callable[[], Iterator[ExecEvent]]

    def __iter__(self) -> Iterator[ExecEvent]:
        return self._events()


class Heartbeats(SandboxCore):
    """The heartbeats of a :class:`~orchard_env.SandboxInstance`, from a thread."""

    _heartbeat_thread: threading.Thread | None = None
    #: Set to stop the heartbeat thread (also wakes it from its sleep at once).
    _heartbeat_stop: threading.Event | None = None

    def start_heartbeat(self, interval: float = 60) -> None:
        """Posts a heartbeat every ``interval`` seconds from a daemon thread, until
        :meth:`stop_heartbeat`, :meth:`delete` or the client's close. Failed heartbeats
        are ignored (the next one may get through); a second call while running does
        nothing."""
        if self._heartbeat_thread is not None and self._heartbeat_thread.is_alive():
            return
        stop = self._heartbeat_stop = threading.Event()

        def beat() -> None:
            while not stop.wait(interval) and not self._client._closed:
                try:
                    self._driver.run(_ops.heartbeat(self.sandbox_id))
                except Exception:  # best effort, as in Orchard's SDK
                    pass

        self._heartbeat_thread = threading.Thread(
            target=beat, name=f"heartbeat-{self.sandbox_id}", daemon=True
        )
        self._heartbeat_thread.start()

    def stop_heartbeat(self) -> None:
        """Stops the heartbeat thread (waits for it, at most a few seconds)."""
        if self._heartbeat_stop is not None:
            self._heartbeat_stop.set()
        thread, self._heartbeat_thread = self._heartbeat_thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

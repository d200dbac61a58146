"""Sandboxes deleted at interpreter exit and on SIGINT/SIGTERM.

Every sandbox created by a client with ``auto_cleanup=True`` is registered here (server
URL, key and id: all that a delete needs, so the delete works even when the client, or
the event loop of an async client, is gone). Deleting it normally unregisters it. What
is left is deleted, in parallel, by an ``atexit`` hook and by handlers of SIGINT and
SIGTERM that then chain to the handler that was there before (the default one
re-delivers the signal, so the process still dies of it).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

import httpx

from . import _ops
from ._http import SyncDriver
from ._retry import RetryPolicy

log = logging.getLogger("orchard_env")

_Key = tuple[str, str | None, str]  # (base_url, api_key, sandbox_id)

#: Protects _pending, the _installed flags and _previous: clients register from any
#: thread. Re-entrant because the signal handler runs in the main thread, possibly while
#: that thread is inside ``register``.
_lock = threading.RLock()
_pending: dict[_Key, None] = {}
_installed = False
_signals_installed = False
_previous: dict[int, Any] = {}
_running = threading.Event()

#: Seconds each exit-time delete may take.
DELETE_TIMEOUT = 30.0
#: Exit-time deletes try three times, at once: a process on its way out does not wait.
EXIT_RETRY = RetryPolicy(
    attempts=2, backoff=0.0, retry_after_default=0.0, retry_after_jitter=0.0, max_retry_after=0.0
)


def _forget_in_child() -> None:
    # A forked child does not own its parent's sandboxes: it must not delete them.
    global _lock
    _lock = threading.RLock()
    _pending.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def register(base_url: str, api_key: str | None, sandbox_id: str) -> None:
    """Remembers a sandbox to delete at exit; installs the hooks on first use."""
    with _lock:
        _pending[(base_url, api_key, sandbox_id)] = None
    _install()


def unregister(base_url: str, api_key: str | None, sandbox_id: str) -> None:
    """Forgets a sandbox (it was deleted, or the caller took it over)."""
    with _lock:
        _pending.pop((base_url, api_key, sandbox_id), None)


def pending() -> list[str]:
    """Ids of the sandboxes that would be deleted at exit now."""
    with _lock:
        return [k[2] for k in _pending]


def delete_now(
    base_url: str, api_key: str | None, sandbox_id: str, *, timeout: float, retry: RetryPolicy
) -> None:
    """Deletes a sandbox over a connection of its own, needing no client or event loop
    (what the exit hooks and ``AsyncSandboxInstance.delete_sync`` do); raises on failure.
    """
    headers = {"X-API-Key": api_key} if api_key else {}
    with httpx.Client(base_url=base_url, headers=headers, timeout=timeout) as http:
        SyncDriver(http, retry).run(_ops.delete_sandbox(sandbox_id, missing_ok=True))


def _delete_one(key: _Key) -> None:
    base_url, api_key, sandbox_id = key
    try:
        delete_now(base_url, api_key, sandbox_id, timeout=DELETE_TIMEOUT, retry=EXIT_RETRY)
    except Exception as err:  # never let cleanup raise at exit
        log.warning("orchard_env: could not delete sandbox %s: %s", sandbox_id, err)


def run() -> None:
    """Deletes every registered sandbox now (what the exit hooks do)."""
    with _lock:
        keys = list(_pending)
        _pending.clear()
    if not keys:
        return
    if len(keys) == 1:
        _delete_one(keys[0])
        return
    with ThreadPoolExecutor(max_workers=min(16, len(keys))) as pool:
        list(pool.map(_delete_one, keys))


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if not _running.is_set():
        _running.set()
        try:
            run()
        finally:
            _running.clear()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        # SIG_DFL (or a handler not set from Python): die of the signal as we would have.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install() -> None:
    global _installed, _signals_installed
    with _lock:
        if not _installed:
            _installed = True
            atexit.register(run)
        if _signals_installed or threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread: next time
        _signals_installed = True
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                _previous[signum] = signal.getsignal(signum)
                signal.signal(signum, _on_signal)
            except (ValueError, OSError):  # embedded interpreters, odd platforms
                pass

# generated from _aio_client.py by scripts/unasync.py; do not edit
"""The client, :class:`SandboxClient`: configuration, connections, and the
sandboxes it creates, finds and cleans up (snapshots, forks and images have modules of
their own)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import httpx

from . import _ops
from ._base import ClientState, check_started
from ._config import new_sandbox_id, resolve_config
from ._http import SyncDriver, make_http
from ._retry import RetryPolicy
from ._sync_core import ClientCore, Closing
from ._sync_images import ClientImages
from ._sync_only import for_each
from ._sync_sandbox import SandboxInstance
from ._sync_snapshots import ClientSnapshots
from .errors import OrchardError
from .models import SandboxInfo


class SandboxClient(ClientSnapshots, ClientImages, ClientCore, Closing):
    """A connection to an Orchard server; makes and finds sandboxes.

    Arguments default to the environment: ``SANDBOX_BASE_URL`` (then
    ``http://localhost:8000``), ``SANDBOX_API_KEY`` and ``SANDBOX_PREFIX`` (the start
    of the ids of the sandboxes it creates). ``timeout`` is the HTTP time-out in
    seconds (and how long ``exec`` waits for a command without a time limit of its
    own). With ``auto_cleanup`` (the default) every sandbox it creates is deleted when
    the client's ``with`` block ends, at interpreter exit, and on SIGINT/SIGTERM.
    Transient failures are retried by ``retry`` (3 times, exponential backoff with
    jitter; a command is never sent twice). ``direct=True`` sends the ``/v1`` sandbox
    calls to each sandbox's agent itself (its Unix socket, or its address) instead of
    through the server.

    >>> client.health()["status"]
    'healthy'
    """

    def __init__(
        self,
        base_url: str | None = None,
        timeout: float = 1200,
        auto_cleanup: bool = True,
        api_key: str | None = None,
        prefix: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        direct: bool = False,
    ) -> None:
        config = resolve_config(base_url, api_key, prefix, timeout, retry, direct)
        self._state = ClientState(config, auto_cleanup)
        http = make_http(config, asynchronous=False)
        assert isinstance(http, httpx.Client)
        self._http = http
        self._driver = SyncDriver(http, config.retry)
        self._agents = {}
        self._closed = False
        #: The HTTP time-out in seconds, as given.
        self.timeout = timeout
        #: The connection pool to the server (an ``httpx.Client``; Orchard's was a
        #: ``requests.Session`` in its sync SDK, and ``headers`` works on both).
        self.session = http

    @property
    def base_url(self) -> str:
        """The server's URL."""
        return self._state.config.base_url

    @property
    def api_key(self) -> str | None:
        """The API key sent as ``X-API-Key`` (from ``SANDBOX_API_KEY`` when not given)."""
        return self._state.config.api_key

    @property
    def max_retries(self) -> int:
        """Retries of a transient failure (3); settable, as in Orchard's SDK."""
        return self._driver.retry.attempts

    @max_retries.setter
    def max_retries(self, value: int) -> None:
        self._driver.retry = dataclasses.replace(self._driver.retry, attempts=int(value))

    @property
    def retry_delay(self) -> float:
        """First backoff after a transport error, doubled each retry (1 s); settable."""
        return self._driver.retry.backoff

    @retry_delay.setter
    def retry_delay(self, value: float) -> None:
        self._driver.retry = dataclasses.replace(self._driver.retry, backoff=float(value))

    @property
    def prefix(self) -> str:
        """Start of the ids of the sandboxes this client creates."""
        return self._state.config.prefix

    @property
    def owned_sandboxes(self) -> list[str]:
        """Ids of the sandboxes this client created and has not deleted."""
        return list(self._state.owned)

    def health(self) -> dict[str, Any]:
        """``GET /health``: ``{"status": "healthy", "version", ...}``."""
        return self._driver.run(_ops.health())

    def resources(self) -> dict[str, Any]:
        """``GET /resources``: CPU, memory and sandbox counts of the server."""
        return self._driver.run(_ops.resources())

    def create_sandbox(
        self,
        image: str,
        block_network: bool = True,
        sandbox_id: str | None = None,
        cpu: str | float | None = None,
        memory: str | None = None,
        timeout: float | None = None,
        wait_ready: bool = True,
        poll_interval: float = 1.0,
        *,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        ttl: float | None = None,
        direct: bool | None = None,
    ) -> SandboxInstance:
        """Creates a sandbox from ``image`` and (by default) waits until it is ready.

        ``cpu`` like ``"2"`` or ``"500m"``, ``memory`` like ``"1Gi"``; ``timeout`` is how
        long readiness may take, in seconds (the server's limit when ``None``). The wait
        is server-side (``/wait``), so ``poll_interval`` is accepted for compatibility
        and not needed. ``env``, ``labels`` and ``ttl`` (seconds) use the ``/v1`` API.
        A sandbox that fails to start is deleted and :class:`~orchard_env.SandboxError`
        (a ``RuntimeError``) raised; one not ready in time, a ``TimeoutError``. One no
        node can take yet (``unschedulable``, on a Kubernetes server) is waited for, not
        failed: ``[ID] Waiting for node... (Ns elapsed): MSG`` is printed every 30 s.

        >>> with client.create_sandbox("busybox:latest", memory="256Mi") as sb:
        ...     sb.info.status, sb.sandbox_id.startswith(client.prefix)
        ('ready', True)
        """
        del poll_interval  # waits block server-side
        created = self._create(
            image,
            block_network=block_network,
            sandbox_id=sandbox_id,
            cpu=cpu,
            memory=memory,
            timeout=timeout,
            wait_ready=wait_ready,
            env=env,
            labels=labels,
            ttl=ttl,
            direct=direct,
        )
        return created

    def _create(
        self,
        image: str,
        *,
        block_network: bool,
        sandbox_id: str | None,
        cpu: str | float | None,
        memory: str | None,
        timeout: float | None,
        wait_ready: bool,
        env: Mapping[str, str] | None,
        labels: Mapping[str, str] | None,
        ttl: float | None,
        direct: bool | None,
    ) -> SandboxInstance:
        sid = sandbox_id or new_sandbox_id(self.prefix)
        self._state.own(sid)
        try:
            info = self._driver.run(
                _ops.create_sandbox(
                    image,
                    prefix=self.prefix,
                    block_network=block_network,
                    sandbox_id=sid,
                    chosen=sandbox_id is not None,
                    cpu=cpu,
                    memory=memory,
                    timeout=timeout,
                    env=env,
                    labels=labels,
                    ttl=ttl,
                )
            )
        except OrchardError as err:
            if not _created_maybe(err):
                self._state.disown(sid)
            raise
        sandbox = SandboxInstance(self, info, direct=self._direct(direct))
        if wait_ready:
            try:
                sandbox.wait_ready(timeout)
                check_started(sandbox.info)
            except BaseException:
                self._delete_quietly(sid)
                raise
        return sandbox

    def get_sandbox(self, sandbox_id: str, *, direct: bool | None = None) -> SandboxInstance:
        """An existing sandbox by id (:class:`~orchard_env.NotFoundError` if there is none).

        The client does not own it: it is deleted only by an explicit ``delete`` or by
        leaving its own ``with`` block.
        """
        info = self._driver.run(_ops.get_sandbox(sandbox_id))
        return SandboxInstance(self, info, direct=self._direct(direct))

    def delete_sandbox(self, sandbox_id: str) -> None:
        """Deletes a sandbox, best effort: never raises (as in Orchard's SDK)."""
        self._delete_quietly(sandbox_id)

    def cleanup_all(self) -> list[str]:
        """Deletes every sandbox this client created and has not deleted; returns their ids."""
        ids = list(self._state.owned)
        for_each(self._delete_quietly, ids)
        return ids

    def list_sandboxes(self) -> list[SandboxInfo]:
        """The caller's sandboxes (``GET /v1/sandboxes``)."""
        return self._driver.run(_ops.list_sandboxes())

    def close(self, cleanup: bool = True) -> None:
        """Deletes the owned sandboxes (with ``auto_cleanup``, unless ``cleanup=False``)
        and closes the connections."""
        if self._closed:
            return
        self._closed = True
        try:
            if cleanup and self._state.auto_cleanup:
                self.cleanup_all()
        finally:
            for agent in self._agents.values():
                agent.close()
            self._http.close()

    def __repr__(self) -> str:
        return f"SandboxClient(base_url={self.base_url!r})"


def _created_maybe(err: OrchardError) -> bool:
    """Whether a failed create may still have made the sandbox (then keep it tracked)."""
    return err.status is None or err.status >= 500

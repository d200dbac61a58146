"""The client, :class:`AsyncSandboxClient`: configuration, connections, and the
sandboxes it creates, finds and cleans up (snapshots, forks and images have modules of
their own)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Generator, Mapping
from types import TracebackType
from typing import Any

import httpx

from . import _ops
from ._aio_core import AsyncClientCore, AsyncClosing
from ._aio_images import AsyncClientImages
from ._aio_only import for_each
from ._aio_sandbox import AsyncSandboxInstance
from ._aio_snapshots import AsyncClientSnapshots
from ._base import ClientState, check_started
from ._config import new_sandbox_id, resolve_config
from ._http import AsyncDriver, make_http
from ._retry import RetryPolicy
from .errors import OrchardError
from .models import SandboxInfo


# Async only: scripts/unasync.py leaves it out of the sync twin (ASYNC_ONLY), whose
# create_sandbox returns the sandbox itself.
class SandboxCreation(Awaitable["AsyncSandboxInstance"]):
    """What :meth:`AsyncSandboxClient.create_sandbox` returns: await it for the sandbox,
    or use it directly in ``async with`` (the sandbox is deleted when the block ends)."""

    def __init__(self, coro: Awaitable[AsyncSandboxInstance]) -> None:
        self._coro = coro
        self._sandbox: AsyncSandboxInstance | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandboxInstance]:
        return self._coro.__await__()

    async def __aenter__(self) -> AsyncSandboxInstance:
        self._sandbox = await self._coro
        return self._sandbox

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sandbox is not None:
            await self._sandbox.delete()


class AsyncSandboxClient(AsyncClientSnapshots, AsyncClientImages, AsyncClientCore, AsyncClosing):
    """Async :class:`~orchard_env.SandboxClient`: same arguments, same environment
    variables, same cleanup; every method is awaitable.

    >>> async def main():
    ...     async with AsyncSandboxClient() as client:
    ...         return (await client.health())["status"]
    >>> asyncio.run(main())
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
        http = make_http(config, asynchronous=True)
        assert isinstance(http, httpx.AsyncClient)
        self._http = http
        self._driver = AsyncDriver(http, config.retry)
        self._agents = {}
        self._closed = False
        #: The HTTP time-out in seconds, as given.
        self.timeout = timeout
        #: The connection pool to the server (an ``httpx.AsyncClient``; Orchard's was a
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

    async def health(self) -> dict[str, Any]:
        """``GET /health``: ``{"status": "healthy", "version", ...}``."""
        return await self._driver.run(_ops.health())

    async def resources(self) -> dict[str, Any]:
        """``GET /resources``: CPU, memory and sandbox counts of the server."""
        return await self._driver.run(_ops.resources())

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
    ) -> SandboxCreation:
        """Creates a sandbox (see :meth:`SandboxClient.create_sandbox`).

        ``sb = await client.create_sandbox(...)``, or
        ``async with client.create_sandbox(...) as sb:``.
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
        return SandboxCreation(created)

    async def _create(
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
    ) -> AsyncSandboxInstance:
        sid = sandbox_id or new_sandbox_id(self.prefix)
        self._state.own(sid)
        try:
            info = await self._driver.run(
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
        sandbox = AsyncSandboxInstance(self, info, direct=self._direct(direct))
        if wait_ready:
            try:
                await sandbox.wait_ready(timeout)
                check_started(sandbox.info)
            except BaseException:
                await self._delete_quietly(sid)
                raise
        return sandbox

    async def get_sandbox(
        self, sandbox_id: str, *, direct: bool | None = None
    ) -> AsyncSandboxInstance:
        """An existing sandbox by id (:class:`~orchard_env.NotFoundError` if there is none).

        The client does not own it: it is deleted only by an explicit ``delete`` or by
        leaving its own ``with`` block.
        """
        info = await self._driver.run(_ops.get_sandbox(sandbox_id))
        return AsyncSandboxInstance(self, info, direct=self._direct(direct))

    async def delete_sandbox(self, sandbox_id: str) -> None:
        """Deletes a sandbox, best effort: never raises (as in Orchard's SDK)."""
        await self._delete_quietly(sandbox_id)

    async def cleanup_all(self) -> list[str]:
        """Deletes (concurrently) every sandbox this client created and has not deleted;
        returns their ids."""
        ids = list(self._state.owned)
        await for_each(self._delete_quietly, ids)
        return ids

    async def list_sandboxes(self) -> list[SandboxInfo]:
        """The caller's sandboxes (``GET /v1/sandboxes``)."""
        return await self._driver.run(_ops.list_sandboxes())

    async def close(self, cleanup: bool = True) -> None:
        """Deletes the owned sandboxes (with ``auto_cleanup``, unless ``cleanup=False``)
        and closes the connections."""
        if self._closed:
            return
        self._closed = True
        try:
            if cleanup and self._state.auto_cleanup:
                await self.cleanup_all()
        finally:
            for agent in self._agents.values():
                await agent.aclose()
            await self._http.aclose()

    def __repr__(self) -> str:
        return f"AsyncSandboxClient(base_url={self.base_url!r})"


def _created_maybe(err: OrchardError) -> bool:
    """Whether a failed create may still have made the sandbox (then keep it tracked)."""
    return err.status is None or err.status >= 500

# unasync: async
"""The asyncio client: :class:`AsyncSandboxClient` and :class:`AsyncSandboxInstance`.

The same methods as the sync client, awaitable; requests and answers go through the
same operations (``_ops``), only the I/O differs.

>>> async def main():
...     async with AsyncSandboxClient() as client:
...         async with client.create_sandbox("busybox:latest") as sandbox:
...             return (await sandbox.exec("echo async")).stdout
>>> asyncio.run(main())
'async\\n'
"""
# unasync: sync
# """The synchronous client: :class:`SandboxClient` and :class:`SandboxInstance`.
#
# >>> with SandboxClient() as client:
# ...     with client.create_sandbox("busybox:latest") as sandbox:
# ...         print(sandbox.exec("echo 'Hello, Orchard!'").stdout)
# Hello, Orchard!
# <BLANKLINE>
# """
# unasync: end

from __future__ import annotations

# unasync: async
# _sync.py is generated from this module by scripts/unasync.py: edit here, then run it.
# The "# unasync:" comments mark where the sync side differs in more than names.
# unasync: end
# unasync: async
import asyncio
import dataclasses
import os
import tempfile
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)

# unasync: sync
# import dataclasses
# import os
# import threading
# from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
#
# from ._streams import IterReader
# unasync: end
from types import TracebackType
from typing import IO, Any, Literal, TypeVar, overload

import httpx

from . import _envcheck, _ops
from ._aio_handles import AsyncExecStream, AsyncProcess, AsyncSession, AsyncTerminal
from ._base import ClientState, agent_key, agent_target, check_started, describe
from ._config import new_sandbox_id, resolve_config
from ._http import AsyncDriver, Op, Route, make_agent_http, make_http
from ._retry import RetryPolicy
from ._streams import (
    NdjsonDecoder,
    archive_root,
    async_body,
    body_from,
    extract_tar,
    file_sink,
    path_chunks,
    pull_event,
    tar_directory,
    upload_source,
)
from .errors import OrchardError, SandboxDeletedError
from .models import (
    AgentEndpoint,
    ExecResult,
    ExtractResult,
    FileEntry,
    FileStat,
    GitApplyResult,
    GitCommitResult,
    GitDiff,
    GitResetResult,
    GitStatus,
    ImageInfo,
    JobResult,
    PatchResult,
    ProcessInfo,
    PtyInfo,
    SandboxInfo,
    SessionInfo,
    Snapshot,
)
from .pty import AsyncContainerProcess, WsTarget

__all__ = [
    "AsyncSandboxClient",
    "AsyncSandboxInstance",
    "AsyncExecStream",
    "AsyncProcess",
    "AsyncSession",
    "AsyncTerminal",
]

Command = str | Sequence[str]
_T = TypeVar("_T")


# unasync: async
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


# unasync: end
class AsyncSandboxClient:
    # unasync: async
    """Async :class:`~orchard_env.SandboxClient`: same arguments, same environment
    variables, same cleanup; every method is awaitable.

    >>> async def main():
    ...     async with AsyncSandboxClient() as client:
    ...         return (await client.health())["status"]
    >>> asyncio.run(main())
    'healthy'
    """

    # unasync: sync
    # """A connection to an Orchard server; makes and finds sandboxes.
    #
    # Arguments default to the environment: ``SANDBOX_BASE_URL`` (then
    # ``http://localhost:8000``), ``SANDBOX_API_KEY`` and ``SANDBOX_PREFIX`` (the start
    # of the ids of the sandboxes it creates). ``timeout`` is the HTTP time-out in
    # seconds (and how long ``exec`` waits for a command without a time limit of its
    # own). With ``auto_cleanup`` (the default) every sandbox it creates is deleted when
    # the client's ``with`` block ends, at interpreter exit, and on SIGINT/SIGTERM.
    # Transient failures are retried by ``retry`` (3 times, exponential backoff with
    # jitter; a command is never sent twice). ``direct=True`` sends the ``/v1`` sandbox
    # calls to each sandbox's agent itself (its Unix socket, or its address) instead of
    # through the server.
    #
    # >>> client.health()["status"]
    # 'healthy'
    # """
    # unasync: end

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
        #: Connection pools to agents of direct sandboxes, by (socket, url).
        self._agents: dict[tuple[str | None, str | None], httpx.AsyncClient] = {}
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
        # unasync: async
        """Creates a sandbox (see :meth:`SandboxClient.create_sandbox`).

        ``sb = await client.create_sandbox(...)``, or
        ``async with client.create_sandbox(...) as sb:``.
        """
        # unasync: sync
        # """Creates a sandbox from ``image`` and (by default) waits until it is ready.
        #
        # ``cpu`` like ``"2"`` or ``"500m"``, ``memory`` like ``"1Gi"``; ``timeout`` is how
        # long readiness may take, in seconds (the server's limit when ``None``). The wait
        # is server-side (``/wait``), so ``poll_interval`` is accepted for compatibility
        # and not needed. ``env``, ``labels`` and ``ttl`` (seconds) use the ``/v1`` API.
        # A sandbox that fails to start is deleted and :class:`~orchard_env.SandboxError`
        # (a ``RuntimeError``) raised; one not ready in time, a ``TimeoutError``.
        #
        # >>> with client.create_sandbox("busybox:latest", memory="256Mi") as sb:
        # ...     sb.info.status, sb.sandbox_id.startswith(client.prefix)
        # ('ready', True)
        # """
        # unasync: end
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
        # unasync: async
        return SandboxCreation(created)
        # unasync: sync
        # return created
        # unasync: end

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
        # unasync: async
        """Deletes (concurrently) every sandbox this client created and has not deleted;
        returns their ids."""
        # unasync: sync
        # """Deletes every sandbox this client created and has not deleted; returns their ids."""
        # unasync: end
        ids = list(self._state.owned)
        # unasync: async
        await asyncio.gather(*(self._delete_quietly(sid) for sid in ids))
        # unasync: sync
        # for sid in ids:
        #     self._delete_quietly(sid)
        # unasync: end
        return ids

    async def list_sandboxes(self) -> list[SandboxInfo]:
        """The caller's sandboxes (``GET /v1/sandboxes``)."""
        return await self._driver.run(_ops.list_sandboxes())

    # --- snapshots and forks -----------------------------------------------------------

    async def fork(
        self,
        snapshot: Snapshot | str,
        k: int = 1,
        *,
        labels: Mapping[str, str] | None = None,
        ttl_s: float | None = None,
        ready_timeout_s: float | None = None,
        direct: bool | None = None,
    ) -> list[AsyncSandboxInstance]:
        # unasync: async
        """Starts ``k`` sandboxes from a snapshot (or its id) and returns them ready (see
        :meth:`SandboxClient.fork`): handles like :meth:`create_sandbox`'s (``async
        with``; owned and cleaned up by this client), with the snapshot's files and shell
        sessions. Running processes are not carried into forks (no process
        checkpointing: CRIU is not available on the servers' kernel). Forks share the
        snapshot's layers, and it cannot be deleted while any of them exists."""
        # unasync: sync
        # """Starts ``k`` sandboxes (1 to 64) from ``snapshot`` (a
        # :class:`~orchard_env.Snapshot` or its id) and returns them once all are ready.
        #
        # Each fork is a sandbox like those :meth:`create_sandbox` makes (a context
        # manager; owned by this client and deleted by its cleanup) with the snapshot's
        # filesystem, image, environment variables, CPU, memory and network, and its shell
        # sessions back (the same session ids, working directories, exported variables and
        # functions: :meth:`SandboxInstance.get_session` finds them). Running processes
        # are not carried into forks: snapshots do not capture them (no process
        # checkpointing; CRIU is not available on the servers' kernel), so a fork starts
        # with no process but its agent and its restored sessions. The forks share the
        # snapshot's layers (nothing is copied; each writes to its own layer, so they
        # diverge independently), and the snapshot cannot be deleted while any of them
        # exists. ``labels`` are the forks' labels; ``ttl_s`` is how long each fork lives
        # (the server's default when ``None``, 0 until deleted); ``ready_timeout_s`` how
        # long readiness may take; ``direct`` as in :meth:`create_sandbox`. All or
        # nothing: if one fork cannot start, none is left (:class:`~orchard_env.SandboxError`).
        #
        # >>> with client.create_sandbox("busybox:latest") as parent:
        # ...     _ = parent.write_file("/workspace/turn", "3")
        # ...     snap = parent.snapshot()
        # >>> forks = client.fork(snap, 2)
        # >>> [f.read_file("/workspace/turn") for f in forks]
        # [b'3', b'3']
        # >>> for f in forks:
        # ...     f.delete()
        # >>> client.delete_snapshot(snap) >= 0
        # True
        # """
        # unasync: end
        infos = await self._driver.run(
            _ops.fork_snapshot(
                _ops.snapshot_id_of(snapshot),
                k,
                labels=labels,
                ttl_s=ttl_s,
                ready_timeout_s=ready_timeout_s,
            )
        )
        forks: list[AsyncSandboxInstance] = []
        for info in infos:
            self._state.own(info.sandbox_id)
            forks.append(AsyncSandboxInstance(self, info, direct=self._direct(direct)))
        try:
            for sandbox in forks:
                check_started(sandbox.info)
        except BaseException:
            for sandbox in forks:
                await self._delete_quietly(sandbox.sandbox_id)
            raise
        return forks

    async def list_snapshots(self) -> list[Snapshot]:
        """The snapshots this API key made, oldest first (``GET /v1/snapshots``)."""
        return await self._driver.run(_ops.list_snapshots())

    async def get_snapshot(self, snapshot: Snapshot | str) -> Snapshot:
        """A snapshot as it is now (``forks`` up to date), by id or
        :class:`~orchard_env.Snapshot` (:class:`~orchard_env.NotFoundError` if there is
        none)."""
        return await self._driver.run(_ops.get_snapshot(_ops.snapshot_id_of(snapshot)))

    async def delete_snapshot(self, snapshot: Snapshot | str) -> int:
        """Deletes a snapshot (by id or :class:`~orchard_env.Snapshot`); returns the disk
        bytes freed (layers no other snapshot or sandbox uses).

        A snapshot cannot be deleted while sandboxes forked from it exist: that raises
        :class:`~orchard_env.ConflictError` (409) naming them; delete the forks first.
        """
        return await self._driver.run(_ops.delete_snapshot(_ops.snapshot_id_of(snapshot)))

    # --- images --------------------------------------------------------------------------

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

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncSandboxClient(base_url={self.base_url!r})"

    # internals shared with AsyncSandboxInstance

    def _direct(self, direct: bool | None) -> bool:
        return self._state.config.direct if direct is None else direct

    async def _delete_quietly(self, sandbox_id: str) -> None:
        try:
            await self._driver.run(_ops.delete_sandbox(sandbox_id, missing_ok=True))
        except Exception:  # best effort by contract: cleanup paths must not raise
            pass
        finally:
            self._state.disown(sandbox_id)

    def _agent_http(self, socket: str | None, url: str | None) -> httpx.AsyncClient:
        key = (socket, url)
        http = self._agents.get(key)
        if http is None:
            made = make_agent_http(socket, url, self._state.config.timeout, asynchronous=True)
            assert isinstance(made, httpx.AsyncClient)
            http = self._agents[key] = made
        return http


def _created_maybe(err: OrchardError) -> bool:
    """Whether a failed create may still have made the sandbox (then keep it tracked)."""
    return err.status is None or err.status >= 500


class AsyncSandboxInstance:
    # unasync: async
    """Async :class:`~orchard_env.SandboxInstance`; ``async with`` deletes it on exit."""

    # unasync: sync
    # """One sandbox. A context manager: leaving the ``with`` block deletes it.
    #
    # The compatible methods (``exec``, ``apply_patch``, ``upload_file``, ...) use the
    # Orchard-compatible routes; the others use ``/v1`` (through the server, or straight
    # to the sandbox's agent for a ``direct`` sandbox).
    # """
    # unasync: end

    def __init__(
        self, client: AsyncSandboxClient, info: SandboxInfo, *, direct: bool = False
    ) -> None:
        self._client = client
        self._driver = client._driver
        self.info = info
        self.direct = direct
        #: Waits and refreshes use /v1 answers (agent endpoint, labels) when it was
        #: created through /v1 or talks to its agent directly.
        self._v1 = direct or "id" in info.raw
        self._route_cache: Route | None = None
        self._deleted = False
        # unasync: async
        self._heartbeat_task: asyncio.Task[None] | None = None
        # unasync: sync
        # self._heartbeat_thread: threading.Thread | None = None
        # #: Set to stop the heartbeat thread (also wakes it from its sleep at once).
        # self._heartbeat_stop = threading.Event()
        # unasync: end

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id."""
        return self.info.sandbox_id

    @property
    def namespace(self) -> str | None:
        """The namespace the server reports (Orchard's Kubernetes namespace)."""
        return self.info.namespace

    @property
    def block_network(self) -> bool | None:
        """Whether egress is blocked."""
        return self.info.block_network

    def _check(self) -> None:
        if self._deleted:
            raise SandboxDeletedError(f"sandbox {self.sandbox_id} has been deleted")

    @property
    def id(self) -> str:
        """Alias of :attr:`sandbox_id`."""
        return self.info.sandbox_id

    @property
    def image(self) -> str | None:
        """The image it runs."""
        return self.info.image

    def __repr__(self) -> str:
        return describe(self.info, self.sandbox_id, self.direct)

    # --- lifecycle ---------------------------------------------------------------------

    async def refresh(self) -> SandboxInfo:
        """Reloads :attr:`info` from the server."""
        self.info = await self._driver.run(_ops.get_sandbox(self.sandbox_id, v1=self._v1))
        return self.info

    async def wait_ready(self, timeout: float | None = 300) -> SandboxInfo:
        """Waits until the sandbox is ready (server-side wait); 408 → ``OrchardTimeoutError``."""
        self.info = await self._driver.run(_ops.wait_sandbox(self.sandbox_id, timeout, v1=self._v1))
        return self.info

    async def heartbeat(self) -> dict[str, Any]:
        """Keeps the sandbox alive: once heartbeats started, it is reaped when they stop."""
        return await self._driver.run(_ops.heartbeat(self.sandbox_id))

    # unasync: async
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

    # unasync: sync
    # def start_heartbeat(self, interval: float = 60) -> None:
    #     """Posts a heartbeat every ``interval`` seconds from a daemon thread, until
    #     :meth:`stop_heartbeat`, :meth:`delete` or the client's close. Failed heartbeats
    #     are ignored (the next one may get through); a second call while running does
    #     nothing."""
    #     if self._heartbeat_thread is not None and self._heartbeat_thread.is_alive():
    #         return
    #     stop = self._heartbeat_stop = threading.Event()
    #
    #     def beat() -> None:
    #         while not stop.wait(interval) and not self._client._closed:
    #             try:
    #                 self._driver.run(_ops.heartbeat(self.sandbox_id))
    #             except Exception:  # best effort, as in Orchard's SDK
    #                 pass
    #
    #     self._heartbeat_thread = threading.Thread(
    #         target=beat, name=f"heartbeat-{self.sandbox_id}", daemon=True
    #     )
    #     self._heartbeat_thread.start()
    #
    # def stop_heartbeat(self) -> None:
    #     """Stops the heartbeat thread (waits for it, at most a few seconds)."""
    #     self._heartbeat_stop.set()
    #     thread, self._heartbeat_thread = self._heartbeat_thread, None
    #     if thread is not None and thread is not threading.current_thread():
    #         thread.join(timeout=5)
    # unasync: end

    async def delete(self) -> None:
        """Deletes the sandbox (quietly when it is already gone); stops its heartbeats.

        Afterwards its methods raise :class:`~orchard_env.SandboxDeletedError`, a
        ``RuntimeError``.
        """
        self.stop_heartbeat()
        self._deleted = True
        await self._client._delete_quietly(self.sandbox_id)

    # unasync: async
    def delete_sync(self) -> None:
        """Deletes the sandbox from synchronous code (a cleanup handler, ``__del__``, a
        closed event loop): one blocking request, best effort, never raises."""
        self.stop_heartbeat()
        self._deleted = True
        state = self._client._state
        try:
            with httpx.Client(
                base_url=state.config.base_url, headers=state.api_headers(), timeout=10
            ) as http:
                http.delete(f"/sandboxes/{_ops._seg(self.sandbox_id)}")
        except Exception:  # best effort by contract
            pass
        finally:
            state.disown(self.sandbox_id)

    # unasync: end

    def detach(self) -> AsyncSandboxInstance:
        """Stops the client from deleting this sandbox at exit; returns it."""
        self._client._state.disown(self.sandbox_id)
        return self

    async def __aenter__(self) -> AsyncSandboxInstance:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.delete()

    # --- pause, resume, snapshot ----------------------------------------------------------

    @property
    def paused(self) -> bool:
        """Whether the sandbox was paused when :attr:`info` was last loaded."""
        return self.info.paused

    async def pause(self) -> SandboxInfo:
        # unasync: async
        """Freezes the sandbox until :meth:`resume` (see :meth:`SandboxInstance.pause`);
        returns (and stores in :attr:`info`) its ``/v1`` description. While paused, its
        exec, file and other agent calls raise :class:`~orchard_env.ConflictError` (409,
        the message says it is paused)."""
        # unasync: sync
        # """Freezes the sandbox: its processes stop where they are, keep their memory, and
        # use no CPU until :meth:`resume`. Returns (and stores in :attr:`info`) the
        # sandbox's ``/v1`` description, ``paused`` set and ``status`` ``"paused"``.
        #
        # While paused, the server answers the sandbox's exec, file, process, session,
        # terminal and git calls (compatible and ``/v1`` alike) with 409:
        # :class:`~orchard_env.ConflictError` whose message says it is paused. A
        # ``direct`` sandbox's calls go to its frozen agent and wait until the resume.
        # Heartbeats and the time to live go on; pausing a paused sandbox is harmless.
        #
        # >>> sandbox.pause().status, sandbox.paused
        # ('paused', True)
        # >>> sandbox.resume().status, sandbox.paused
        # ('running', False)
        # """
        # unasync: end
        self._check()
        self.info = await self._driver.run(_ops.pause_sandbox(self.sandbox_id))
        self._v1 = True  # refreshes must keep reporting `paused` (compatible answers do not)
        return self.info

    async def resume(self) -> SandboxInfo:
        """Thaws a paused sandbox: its processes go on where they stopped, and its calls
        work again. Returns (and stores in :attr:`info`) its ``/v1`` description,
        ``paused`` cleared. Resuming a running sandbox is harmless."""
        self._check()
        self.info = await self._driver.run(_ops.resume_sandbox(self.sandbox_id))
        self._v1 = True
        return self.info

    async def snapshot(self, labels: Mapping[str, str] | None = None) -> Snapshot:
        # unasync: async
        """Captures the sandbox as a :class:`~orchard_env.Snapshot` (see
        :meth:`SandboxInstance.snapshot`): its filesystem changes, environment and shell
        sessions. Running processes are not captured and never carried into forks (no
        process checkpointing: CRIU is not available on the servers' kernel). Forks
        share its layers; it cannot be deleted while any fork exists."""
        # unasync: sync
        # """Captures the sandbox as an immutable :class:`~orchard_env.Snapshot` that
        # :meth:`SandboxClient.fork` starts new sandboxes from.
        #
        # What is captured: the filesystem changes since the image (the local backend's
        # in-memory ``/tmp`` included, copied into each fork), the image, environment,
        # CPU, memory and network, and each live shell session's working directory,
        # exported variables and functions. Running processes are NOT captured, and are
        # never carried into forks: there is no process checkpointing (CRIU is not
        # available on the servers' kernel). The sandbox is frozen only for the capture
        # (``frozen_ms``) and goes on unchanged. Snapshots are content-addressed: the
        # same state and ``labels`` give the same snapshot (an equal one taken before is
        # answered, its ``sandbox_id`` that of its own sandbox). Forks share the snapshot's
        # layers, and it cannot be deleted while any fork exists
        # (:meth:`SandboxClient.delete_snapshot`). Snapshots count against the API key's
        # snapshot bytes quota: :class:`~orchard_env.QuotaError` (429) past it.
        #
        # >>> snap = sandbox.snapshot(labels={"turn": "3"})
        # >>> snap.labels, snap.processes, snap.sandbox_id == sandbox.id
        # ({'turn': '3'}, 'none', True)
        # >>> client.delete_snapshot(snap) >= 0
        # True
        # """
        # unasync: end
        self._check()
        return await self._driver.run(_ops.take_snapshot(self.sandbox_id, labels))

    # --- compatible API --------------------------------------------------------------------

    @overload
    async def exec(
        self,
        command: Command,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        poll_interval: float = 0.1,
        login_shell: bool = False,
        pty: Literal[False] = False,
        rows: int = 24,
        cols: int = 80,
    ) -> JobResult: ...

    @overload
    async def exec(
        self,
        command: Command,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        poll_interval: float = 0.1,
        login_shell: bool = False,
        *,
        pty: Literal[True],
        rows: int = 24,
        cols: int = 80,
    ) -> AsyncContainerProcess: ...

    async def exec(
        self,
        command: Command,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        poll_interval: float = 0.1,
        login_shell: bool = False,
        pty: bool = False,
        rows: int = 24,
        cols: int = 80,
    ) -> JobResult | AsyncContainerProcess:
        # unasync: async
        """Runs ``command`` through the jobs API (see :meth:`SandboxInstance.exec`)."""
        # unasync: sync
        # """Runs ``command`` (a shell string, or an argv list) and waits for it.
        #
        # Through the compatible jobs API: commands of one sandbox run one at a time, in
        # order. ``timeout`` is the command's time limit in seconds. Returns a
        # :class:`~orchard_env.JobResult` (not an exception) for a non-zero exit; with
        # ``wait=False``, the queued job at once (:meth:`get_job` follows it). The wait is
        # server-side, so ``poll_interval`` is accepted for compatibility and not needed.
        # With ``pty=True`` the command runs on a ``rows`` x ``cols`` terminal and a
        # :class:`~orchard_env.ContainerProcess` is returned at once.
        #
        # >>> sandbox.exec(["echo", "a b"]).stdout
        # 'a b\\n'
        # >>> sandbox.exec("pwd", cwd="/tmp").stdout
        # '/tmp\\n'
        # """
        # unasync: end
        del poll_interval  # waits block server-side
        self._check()
        if pty:
            return await self._open_compat_pty(
                command, cwd=cwd, env=env, login_shell=login_shell, rows=rows, cols=cols
            )
        if not wait:
            job_id = await self._driver.run(
                _ops.submit_job(
                    self.sandbox_id,
                    command,
                    timeout=timeout,
                    cwd=cwd,
                    env=env,
                    login_shell=login_shell,
                )
            )
            return _ops.queued_job(job_id, self.sandbox_id, command)
        return await self._driver.run(
            _ops.exec_job(
                self.sandbox_id,
                command,
                timeout=timeout,
                wait_limit=self._client._state.job_wait_limit(timeout),
                cwd=cwd,
                env=env,
                login_shell=login_shell,
            )
        )

    async def _open_compat_pty(
        self,
        command: Command,
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        login_shell: bool,
        rows: int = 24,
        cols: int = 80,
    ) -> AsyncContainerProcess:
        init = _ops.pty_init_frame(
            command, cwd=cwd, env=env, rows=rows, cols=cols, login_shell=login_shell
        )
        target = await self._ws_target(_ops.compat_pty_paths(self.sandbox_id))
        return await AsyncContainerProcess.open(target, init=init)

    async def get_job(self, job_id: str) -> JobResult:
        """A job by id, as it is now."""
        return await self._driver.run(_ops.get_job(job_id))

    async def wait_job(self, job_id: str, timeout: float | None = None) -> JobResult:
        """Waits for a job to finish (at most ``timeout`` seconds) and returns it."""
        return await self._driver.run(_ops.wait_job(job_id, timeout))

    async def apply_patch(self, patch: str, timeout: float = 30) -> PatchResult:
        """Applies a unified diff in the working directory (``git apply`` semantics).

        Returns ``{"success", "stdout", "stderr", "exit_code", "error"}``.
        """
        self._check()
        return await self._driver.run(_ops.apply_patch(self.sandbox_id, patch, timeout))

    async def upload_content(self, content: bytes | str, remote_path: str) -> dict[str, Any]:
        # unasync: async
        """Writes ``content`` to the file ``remote_path`` (compatible route)."""
        # unasync: sync
        # """Writes ``content`` to the file ``remote_path`` (compatible route, base64 JSON).
        #
        # >>> sandbox.upload_content("hello", "/tmp/hello.txt")["size"]
        # 5
        # >>> sandbox.download_content("/tmp/hello.txt")
        # b'hello'
        # """
        # unasync: end
        self._check()
        data = content.encode() if isinstance(content, str) else bytes(content)
        return await self._driver.run(_ops.upload_content(self.sandbox_id, data, remote_path))

    async def upload_file(
        self, local_path: str | os.PathLike[str], remote_path: str
    ) -> dict[str, Any]:
        """Uploads the local file ``local_path`` to ``remote_path`` (compatible route):
        ``{"success", "path", "size"}``."""
        self._check()
        with open(local_path, "rb") as f:
            data = f.read()
        return await self._driver.run(_ops.upload_content(self.sandbox_id, data, remote_path))

    async def download_content(self, remote_path: str) -> bytes:
        """The bytes of the file ``remote_path`` (compatible route)."""
        self._check()
        return await self._driver.run(_ops.download_content(self.sandbox_id, remote_path))

    async def download_file(self, remote_path: str, local_path: str | os.PathLike[str]) -> int:
        """Saves the file ``remote_path`` as ``local_path``; returns the bytes written."""
        self._check()
        data = await self._driver.run(_ops.download_content(self.sandbox_id, remote_path))
        with open(local_path, "wb") as f:
            f.write(data)
        return len(data)

    async def list_files(self, remote_path: str = "/") -> list[FileEntry]:
        """Entries of a directory: ``{"name", "type": "file"|"directory", "size", "modified"}``."""
        self._check()
        return await self._driver.run(_ops.list_files(self.sandbox_id, remote_path))

    async def check_env(self, verbose: bool = True) -> dict[str, Any]:
        """How the sandbox's shells are set up, from a bare and a login-shell probe.

        Keys: ``bashrc_loaded``, ``conda_available``, ``conda_env``, ``conda_prefix``,
        ``path`` (login shell), ``bare_path``, ``python``, ``python3``,
        ``python_version`` (and ``has_bashrc``, ``conda_broken``, ``conda_exe``). With
        ``verbose`` a summary is printed.
        """
        self._check()
        wait_limit = self._client._state.job_wait_limit(_envcheck.PROBE_TIMEOUT)
        info = await self._driver.run(_envcheck.check(self.sandbox_id, wait_limit))
        if verbose:
            print(_envcheck.summary(self.sandbox_id, info))
        return info

    # --- /v1: exec --------------------------------------------------------------------------

    async def _endpoint(self) -> AgentEndpoint:
        info = self.info
        if info.agent is None:
            info = await self._driver.run(_ops.get_sandbox(self.sandbox_id, v1=True))
            if info.agent is None:
                raise OrchardError(f"sandbox {self.sandbox_id} has no agent endpoint (not ready?)")
            self.info = info
        return info.agent

    async def _route(self) -> Route:
        if self._route_cache is None:
            if self.direct:
                endpoint = await self._endpoint()
                socket, url = agent_key(endpoint)
                http = self._client._agent_http(socket, url)
                self._route_cache = Route(http, "/v1", {"x-orchard-token": endpoint.token})
            else:
                prefix = _ops.server_agent_prefix(self.sandbox_id)
                self._route_cache = Route(self._client._http, prefix)
        return self._route_cache

    async def _ws_target(self, paths: tuple[str, str]) -> WsTarget:
        """A WebSocket route given as ``(agent_path, server_path)`` (see
        :func:`_ops.pty_attach_paths`): the agent's own when direct, else the server's."""
        agent_path, server_path = paths
        if self.direct:
            return agent_target(await self._endpoint(), agent_path)
        return self._client._state.ws_target(server_path)

    async def _run(self, op: Op[_T]) -> _T:
        """Runs an agent operation on this sandbox's route."""
        self._check()
        return await self._driver.run(op, await self._route())

    async def run(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
        shell: str | None = None,
    ) -> ExecResult:
        # unasync: async
        """Runs ``command`` through ``/v1`` (see :meth:`SandboxInstance.run`)."""
        # unasync: sync
        # """Runs ``command`` through ``/v1`` and returns exit code, signal and both streams.
        #
        # Unlike :meth:`exec`, commands run concurrently, ``stdin`` can be given, and a
        # command killed at its ``timeout`` (seconds) says so in ``timed_out``.
        #
        # >>> sandbox.run("cat", stdin="from stdin").stdout
        # 'from stdin'
        # >>> sandbox.run("sleep 5", timeout=0.2).timed_out
        # True
        # """
        # unasync: end
        body = _ops.exec_body(
            command,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            shell=shell,
        )
        return await self._run(_ops.run(body, timeout))

    def exec_stream(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        shell: str | None = None,
        kill_on_disconnect: bool = False,
    ) -> AsyncExecStream:
        # unasync: async
        """The events of ``command`` as an async iterator (``async for``; ``async with``
        closes it when left early). See :meth:`SandboxInstance.exec_stream`."""
        # unasync: sync
        # """Runs ``command`` and yields its events as they happen.
        #
        # Iterate it (or use it in a ``with`` block and iterate): an
        # :class:`~orchard_env.ExecStart`, then :class:`~orchard_env.ExecOutput` chunks,
        # then an :class:`~orchard_env.ExecExit`. The command starts when iteration does.
        # With ``kill_on_disconnect`` the command is killed if the stream is closed early.
        #
        # >>> events = list(sandbox.exec_stream("echo one; echo two"))
        # >>> b"".join(e.data for e in events if isinstance(e, ExecOutput)), events[-1].exit_code
        # (b'one\\ntwo\\n', 0)
        # """
        # unasync: end
        body = _ops.exec_body(
            command,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            shell=shell,
            kill_on_disconnect=kill_on_disconnect,
        )
        return AsyncExecStream(self, _ops.exec_stream_request(body))

    async def agent_health(self) -> dict[str, Any]:
        """The agent's health: version, uptime, processes, memory and CPU, limits."""
        return await self._run(_ops.agent_health())

    # --- /v1: background processes ---------------------------------------------------------

    async def start_process(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        shell: str | None = None,
    ) -> AsyncProcess:
        # unasync: async
        """Starts ``command`` in the background."""
        # unasync: sync
        # """Starts ``command`` in the background and returns a :class:`Process` handle.
        #
        # >>> p = sandbox.start_process("read x; echo got $x")
        # >>> _ = p.write_stdin("it\\n", eof=True)
        # >>> p.wait(timeout=30).exit_code, p.read_output().stdout
        # (0, b'got it\\n')
        # """
        # unasync: end
        body = _ops.exec_body(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, shell=shell)
        return AsyncProcess(self, await self._run(_ops.start_process(body)))

    async def list_processes(self) -> list[ProcessInfo]:
        """Running background processes, and exited ones still kept."""
        return await self._run(_ops.list_processes())

    async def get_process(self, process_id: str) -> AsyncProcess:
        """A handle on an existing background process."""
        return AsyncProcess(self, await self._run(_ops.get_process(process_id)))

    # --- /v1: sessions ------------------------------------------------------------------

    async def create_session(
        self,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        shell: str | None = None,
    ) -> AsyncSession:
        # unasync: async
        """Starts a persistent shell."""
        # unasync: sync
        # """Starts a persistent shell: ``cd``, ``export`` and functions carry over.
        #
        # >>> with sandbox.create_session() as s:
        # ...     _ = s.run("cd /tmp && export X=42")
        # ...     s.run("echo $PWD $X").stdout
        # '/tmp 42\\n'
        # """
        # unasync: end
        return AsyncSession(self, await self._run(_ops.create_session(cwd, env, shell)))

    async def list_sessions(self) -> list[SessionInfo]:
        """Every session of the sandbox."""
        return await self._run(_ops.list_sessions())

    async def get_session(self, session_id: str) -> AsyncSession:
        """A handle on an existing session."""
        return AsyncSession(self, await self._run(_ops.get_session(session_id)))

    # --- /v1: terminals ----------------------------------------------------------------------

    async def create_pty(
        self,
        command: Command | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        rows: int | None = None,
        cols: int | None = None,
        login_shell: bool = False,
        idle_timeout: float | None = None,
    ) -> AsyncTerminal:
        # unasync: async
        """Starts a re-attachable terminal (see :meth:`SandboxInstance.create_pty`)."""
        # unasync: sync
        # """Starts ``command`` (default: an interactive shell) on a terminal that outlives
        # connections: :meth:`Terminal.attach` to use it, detach, attach again later.
        #
        # >>> term = sandbox.create_pty()
        # >>> with term.attach() as p:
        # ...     p.write("echo $((6*7))\\n")
        # ...     _ = p.read_until("42", timeout=30)
        # >>> with term.attach() as p:   # re-attach: the scrollback comes first
        # ...     b"42" in p.read_until("42", timeout=30)
        # True
        # >>> term.close()
        # """
        # unasync: end
        info = await self._run(
            _ops.create_pty(
                command,
                cwd=cwd,
                env=env,
                rows=rows,
                cols=cols,
                login_shell=login_shell,
                idle_timeout=idle_timeout,
            )
        )
        return AsyncTerminal(self, info)

    async def list_ptys(self) -> list[PtyInfo]:
        """Every terminal of the sandbox."""
        return await self._run(_ops.list_ptys())

    async def get_pty(self, pty_id: str) -> AsyncTerminal:
        """A handle on an existing terminal (to re-attach)."""
        return AsyncTerminal(self, await self._run(_ops.get_pty(pty_id)))

    async def _attach_target(self, pty_id: str) -> WsTarget:
        return await self._ws_target(_ops.pty_attach_paths(self.sandbox_id, pty_id))

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
        return await self._run(
            _ops.write_file(
                path, async_body(content), replayable=replayable, mode=mode, parents=parents
            )
        )

    async def read_file(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> bytes:
        """The bytes of ``path`` (or ``length`` bytes from ``offset``)."""
        return await self._run(_ops.read_file(path, offset, length))

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

    # --- /v1: git --------------------------------------------------------------------------

    async def git_status(self, repo: str) -> GitStatus:
        """Branch, HEAD and changed paths of the repository at ``repo``."""
        return await self._run(_ops.git_status(repo))

    async def git_diff(
        self,
        repo: str,
        *,
        base: str | None = None,
        include_untracked: bool = True,
        binary: bool = True,
    ) -> GitDiff:
        """The work tree against ``base`` (default HEAD) as a patch ``git apply`` accepts."""
        return await self._run(_ops.git_diff(repo, base, include_untracked, binary))

    async def git_apply(
        self, repo: str, patch: str, *, check_only: bool = False, fuzzy: bool = False
    ) -> GitApplyResult:
        """Applies ``patch`` all or nothing; a patch that does not apply is reported in
        ``conflicts``, not raised."""
        return await self._run(_ops.git_apply(repo, patch, check_only, fuzzy))

    async def git_commit(
        self,
        repo: str,
        message: str,
        *,
        author_name: str | None = None,
        author_email: str | None = None,
        allow_empty: bool = False,
    ) -> GitCommitResult:
        """Stages everything and commits it on HEAD."""
        return await self._run(
            _ops.git_commit(repo, message, author_name, author_email, allow_empty)
        )

    async def git_reset(
        self,
        repo: str,
        target: str | None = None,
        *,
        clean_untracked: bool = True,
        keep_ignored: bool = True,
    ) -> GitResetResult:
        """Hard reset to ``target`` (default HEAD), removing untracked files by default."""
        return await self._run(_ops.git_reset(repo, target, clean_untracked, keep_ignored))

"""What the parts of a client share: :class:`AsyncClientCore` (a client's configuration,
connections and owned sandboxes), :class:`AsyncSandboxCore` (a sandbox's description
and where its calls go), :class:`AsyncSandboxHandle` (a session, terminal or process of
a sandbox) and :class:`AsyncClosing` (``async with`` for what ends by ``close``).

Each capability (jobs, exec, sessions, files, git, snapshots, images) has a module that
adds its methods to one of these; the client and sandbox modules put them together. The
``_aio_`` modules are written for asyncio; their ``_sync_`` twins are generated from
them by ``scripts/unasync.py``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar

import httpx

from . import _ops
from ._base import ClientState, agent_key, agent_target
from ._http import AsyncDriver, Op, Route, make_agent_http
from .errors import OrchardError, SandboxDeletedError
from .models import AgentEndpoint, ProcessInfo, PtyInfo, SandboxInfo, SessionInfo
from .pty import WsTarget

_T = TypeVar("_T")
#: What the agent says of a handle's session, terminal or process.
_Info = TypeVar("_Info", bound=SessionInfo | PtyInfo | ProcessInfo)

#: A command: a shell string, or an argv list.
Command = _ops.Command


class AsyncClosable(Protocol):
    """What :class:`AsyncClosing` is mixed into."""

    async def close(self) -> None: ...


class AsyncClosing:
    """``async with`` gives the object itself, and closes it on the way out (its
    :meth:`close`): the client, a session, a terminal."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self: AsyncClosable,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncClientCore:
    """The state of an :class:`~orchard_env.AsyncSandboxClient` (set by its
    ``__init__``) and the internals its parts share."""

    _state: ClientState
    _http: httpx.AsyncClient
    _driver: AsyncDriver
    #: Connection pools to agents of direct sandboxes, by (socket, url).
    _agents: dict[tuple[str | None, str | None], httpx.AsyncClient]
    _closed: bool

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


class AsyncSandboxCore:
    """The state of an :class:`~orchard_env.AsyncSandboxInstance` and the routing of its
    calls: through the server (``/v1/sandboxes/{id}/...``), or straight to its agent
    when it is ``direct``."""

    def __init__(self, client: AsyncClientCore, info: SandboxInfo, *, direct: bool = False) -> None:
        self._client = client
        self._driver = client._driver
        self.info = info
        self.direct = direct
        #: Waits and refreshes use /v1 answers (agent endpoint, labels) when it was
        #: created through /v1 or talks to its agent directly.
        self._v1 = direct or "id" in info.raw
        self._route_cache: Route | None = None
        self._deleted = False

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

    @property
    def id(self) -> str:
        """Alias of :attr:`sandbox_id`."""
        return self.info.sandbox_id

    @property
    def image(self) -> str | None:
        """The image it runs."""
        return self.info.image

    def _check(self) -> None:
        if self._deleted:
            raise SandboxDeletedError(f"sandbox {self.sandbox_id} has been deleted")

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

    async def _run(self, op: Op[_T]) -> _T:
        """Runs an agent operation on this sandbox's route."""
        self._check()
        return await self._driver.run(op, await self._route())

    async def _ws_target(self, paths: tuple[str, str]) -> WsTarget:
        """A WebSocket route given as ``(agent_path, server_path)`` (see
        :func:`_ops.pty_attach_paths`): the agent's own when direct, else the server's."""
        agent_path, server_path = paths
        if self.direct:
            return agent_target(await self._endpoint(), agent_path)
        return self._client._state.ws_target(server_path)


class AsyncSandboxHandle(Generic[_Info]):
    """A session, terminal or process of a sandbox: its agent's description in
    :attr:`info`, kept as the calls that answer one last saw it."""

    def __init__(self, sandbox: AsyncSandboxCore, info: _Info) -> None:
        self._sandbox = sandbox
        #: It as last seen.
        self.info = info

    @property
    def id(self) -> str:
        """The agent's id of it (the session's, terminal's or process's)."""
        return self.info.id

    async def _update(self, op: Op[_Info]) -> _Info:
        """Runs ``op`` on the sandbox and keeps its answer as :attr:`info`."""
        self.info = await self._sandbox._run(op)
        return self.info

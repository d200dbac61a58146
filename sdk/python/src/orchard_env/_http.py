"""The only place that does I/O for the HTTP API: a sync and an async driver.

Everything else is "sans I/O": an operation (see ``_ops``) is a generator that yields
:class:`Request` values and receives a :class:`Reply` for each; it builds every
request and parses every answer. A driver sends what the operation yields, with the
retry policy, and raises the SDK's exception for an error status. The sync client and
the async client differ only in which driver runs the same operations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import time
from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from ._config import ClientConfig
from ._retry import Idempotency, RetryPolicy
from .errors import OrchardConnectionError, OrchardError, OrchardTimeoutError, error_from_body

_T = TypeVar("_T")

#: Extra seconds a long-poll's read time-out gets over the server-side wait.
WAIT_MARGIN = 30.0

USER_AGENT = "orchard-env-python/0.1.0"


@dataclass
class Request:
    """One HTTP request, before routing.

    ``agent=True`` marks a route of a sandbox's agent: ``path`` is then relative to the
    agent API (``/exec``), and the route (through the orchestrator, or direct) decides
    the prefix, the connection and the auth header. ``ok`` lists error statuses that
    the operation handles itself instead of raising. ``timeout`` overrides the read
    time-out (long polls, commands with a time limit).
    """

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    content: Any = None
    headers: Mapping[str, str] | None = None
    idempotency: Idempotency = Idempotency.SAFE
    timeout: float | None = None
    agent: bool = False
    ok: tuple[int, ...] = ()


@dataclass
class Reply:
    """A finished answer: status, headers, body, and how many sends it took."""

    status: int
    headers: httpx.Headers
    content: bytes
    attempts: int = 1

    def json(self) -> Any:
        """The body parsed as JSON."""
        return jsonlib.loads(self.content) if self.content else None


@dataclass
class Route:
    """Where agent routes of one sandbox go: a connection, a path prefix and headers."""

    http: httpx.Client | httpx.AsyncClient
    prefix: str
    headers: dict[str, str] = field(default_factory=dict)


Op = Generator[Request, Reply, _T]


def _params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not params:
        return None
    out: dict[str, Any] = {}
    for k, v in params.items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else v
    return out


def build(
    http: httpx.Client | httpx.AsyncClient, req: Request, route: Route | None
) -> tuple[httpx.Client | httpx.AsyncClient, httpx.Request]:
    """Turns ``req`` into an ``httpx.Request`` on the connection it must use."""
    headers: dict[str, str] = {}
    path = req.path
    if req.agent:
        if route is None:
            raise RuntimeError("agent request without a route")
        http = route.http
        path = route.prefix + req.path
        headers.update(route.headers)
    if req.headers:
        headers.update(req.headers)
    timeout: Any = httpx.USE_CLIENT_DEFAULT
    if req.timeout is not None:
        connect = http.timeout.connect
        timeout = httpx.Timeout(req.timeout, connect=connect)
    request = http.build_request(
        req.method,
        path,
        params=_params(req.params),
        json=req.json,
        content=req.content,
        headers=headers or None,
        timeout=timeout,
    )
    return http, request


def make_http(config: ClientConfig, *, asynchronous: bool) -> httpx.Client | httpx.AsyncClient:
    """The orchestrator connection pool of a client."""
    headers = {"User-Agent": USER_AGENT}
    if config.api_key:
        headers["X-API-Key"] = config.api_key
    timeout = httpx.Timeout(config.timeout, connect=min(10.0, config.timeout))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    if asynchronous:
        return httpx.AsyncClient(
            base_url=config.base_url, headers=headers, timeout=timeout, limits=limits
        )
    return httpx.Client(base_url=config.base_url, headers=headers, timeout=timeout, limits=limits)


def make_agent_http(
    socket: str | None, url: str | None, timeout: float, *, asynchronous: bool
) -> httpx.Client | httpx.AsyncClient:
    """A connection pool to a sandbox's agent: its Unix socket, else its URL."""
    headers = {"User-Agent": USER_AGENT}
    to = httpx.Timeout(timeout, connect=min(10.0, timeout))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    if socket:
        if asynchronous:
            return httpx.AsyncClient(
                base_url="http://agent",
                transport=httpx.AsyncHTTPTransport(uds=socket, limits=limits),
                headers=headers,
                timeout=to,
            )
        return httpx.Client(
            base_url="http://agent",
            transport=httpx.HTTPTransport(uds=socket, limits=limits),
            headers=headers,
            timeout=to,
        )
    if not url:
        raise OrchardError("the sandbox's agent has neither a socket nor a URL")
    if asynchronous:
        return httpx.AsyncClient(base_url=url, headers=headers, timeout=to, limits=limits)
    return httpx.Client(base_url=url, headers=headers, timeout=to, limits=limits)


def transport_error(err: httpx.HTTPError, req: Request) -> OrchardError:
    """The SDK exception for a transport failure that is not (or no longer) retried."""
    what = f"{req.method} {req.path}"
    if isinstance(err, httpx.TimeoutException):
        return OrchardTimeoutError(f"{what}: timed out ({type(err).__name__})")
    return OrchardConnectionError(f"{what}: {type(err).__name__}: {err}")


def _raise_for(req: Request, response: httpx.Response) -> None:
    status = response.status_code
    if status >= 400 and status not in req.ok:
        raise error_from_body(
            status,
            response.content,
            headers=response.headers,
            method=req.method,
            url=str(response.request.url),
        )


class SyncDriver:
    """Runs operations on an ``httpx.Client``."""

    def __init__(self, http: httpx.Client, retry: RetryPolicy) -> None:
        self.http = http
        self.retry = retry

    def run(self, op: Op[_T], route: Route | None = None) -> _T:
        """Runs ``op`` to its end and returns its value."""
        try:
            req = next(op)
            while True:
                req = op.send(self.send(req, route))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            op.close()

    def _open(self, req: Request, route: Route | None, stream: bool) -> tuple[httpx.Response, int]:
        attempt = 0
        while True:
            attempt += 1
            http, request = build(self.http, req, route)
            assert isinstance(http, httpx.Client)
            try:
                response = http.send(request, stream=stream)
            except httpx.HTTPError as err:
                if self.retry.should_retry_error(req.idempotency, err, attempt):
                    delay = self.retry.delay(attempt)
                    self.retry.notify(attempt, err, delay)
                    time.sleep(delay)
                    continue
                raise transport_error(err, req) from err
            if self.retry.should_retry_status(response.status_code, attempt):
                retry_after = response.headers.get("retry-after")
                response.close()
                delay = self.retry.delay_unavailable(retry_after)
                self.retry.notify(attempt, None, delay)
                time.sleep(delay)
                continue
            return response, attempt

    def send(self, req: Request, route: Route | None = None) -> Reply:
        """Sends ``req`` (with retries) and returns the read answer."""
        response, attempts = self._open(req, route, stream=False)
        _raise_for(req, response)
        return Reply(response.status_code, response.headers, response.content, attempts)

    @contextlib.contextmanager
    def stream(self, req: Request, route: Route | None = None) -> Iterator[httpx.Response]:
        """Sends ``req`` and yields the response with its body not yet read."""
        response, _ = self._open(req, route, stream=True)
        try:
            if response.status_code >= 400:
                response.read()
                _raise_for(req, response)
            yield response
        finally:
            response.close()


class AsyncDriver:
    """Runs operations on an ``httpx.AsyncClient``."""

    def __init__(self, http: httpx.AsyncClient, retry: RetryPolicy) -> None:
        self.http = http
        self.retry = retry

    async def run(self, op: Op[_T], route: Route | None = None) -> _T:
        """Runs ``op`` to its end and returns its value."""
        try:
            req = next(op)
            while True:
                req = op.send(await self.send(req, route))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            op.close()

    async def _open(
        self, req: Request, route: Route | None, stream: bool
    ) -> tuple[httpx.Response, int]:
        attempt = 0
        while True:
            attempt += 1
            http, request = build(self.http, req, route)
            assert isinstance(http, httpx.AsyncClient)
            try:
                response = await http.send(request, stream=stream)
            except httpx.HTTPError as err:
                if self.retry.should_retry_error(req.idempotency, err, attempt):
                    delay = self.retry.delay(attempt)
                    self.retry.notify(attempt, err, delay)
                    await asyncio.sleep(delay)
                    continue
                raise transport_error(err, req) from err
            if self.retry.should_retry_status(response.status_code, attempt):
                retry_after = response.headers.get("retry-after")
                await response.aclose()
                delay = self.retry.delay_unavailable(retry_after)
                self.retry.notify(attempt, None, delay)
                await asyncio.sleep(delay)
                continue
            return response, attempt

    async def send(self, req: Request, route: Route | None = None) -> Reply:
        """Sends ``req`` (with retries) and returns the read answer."""
        response, attempts = await self._open(req, route, stream=False)
        _raise_for(req, response)
        return Reply(response.status_code, response.headers, response.content, attempts)

    @contextlib.asynccontextmanager
    async def stream(
        self, req: Request, route: Route | None = None
    ) -> AsyncIterator[httpx.Response]:
        """Sends ``req`` and yields the response with its body not yet read."""
        response, _ = await self._open(req, route, stream=True)
        try:
            if response.status_code >= 400:
                await response.aread()
                _raise_for(req, response)
            yield response
        finally:
            await response.aclose()

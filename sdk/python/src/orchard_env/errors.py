"""The exceptions of the SDK: one small hierarchy under :class:`OrchardError`.

Every error the server answers carries a JSON body: the orchestrator's
``{"detail": ..., "code": ...}``, or the agent's ``{"code": ..., "message": ...}`` on
proxied and direct ``/v1`` routes. :func:`error_from_response` turns either into an
exception, keeping ``status``, ``code`` and ``detail``: each of the orchestrator's codes
has its own class (``not_found`` is :class:`NotFoundError`, ``permission_denied``
:class:`PermissionDeniedError`...), and an answer without a known code gets the class of
its status. The class of a code is always one of its status's class, or a subclass, so
catching the status class catches it.

>>> try:
...     client.get_sandbox("no-such-sandbox")
... except NotFoundError as e:
...     print(e.status, e.code)
404 not_found
"""

from __future__ import annotations

import builtins
import http
import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import httpx
import requests
import requests.structures
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = [
    "OrchardError",
    "APIError",
    "BadRequestError",
    "AuthError",
    "PermissionDeniedError",
    "BodyTooLargeError",
    "UnprocessableError",
    "NotFoundError",
    "ConflictError",
    "OrchardTimeoutError",
    "QuotaError",
    "SandboxError",
    "ServerError",
    "UnavailableError",
    "NotImplementedByServerError",
    "OrchardConnectionError",
    "RequestTimeoutError",
    "SandboxDeletedError",
    "TerminalError",
    "error_from_response",
    "error_from_close_code",
]


class OrchardError(Exception):
    """Base of every exception the SDK raises.

    ``status`` is the HTTP status (``None`` for errors without one, such as a dropped
    connection), ``code`` the machine-readable code (``"not_found"``, ``"timeout"``...)
    and ``detail`` the server's message.
    """

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.code = code
        self.body = body

    # ``aiohttp.ClientResponseError`` (a base of :class:`APIError`) has a deprecated
    # ``code`` property that aliases ``status``; ours is the error's machine-readable
    # code, so it is defined here, ahead of aiohttp's in the MRO.
    @property
    def code(self) -> str | None:
        """Machine-readable code (``"not_found"``, ``"timeout"``...), or ``None``."""
        return self._code

    @code.setter
    def code(self, value: str | None) -> None:
        self._code = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.code:
            parts.append(self.code)
        prefix = " ".join(parts)
        return f"{prefix}: {self.detail}" if prefix else self.detail


# aiohttp types ``status`` as ``int`` and ``code`` as its deprecated alias; ours are
# ``int | None`` and the machine-readable code (mypy's [misc] on the three classes below).
class APIError(  # type: ignore[misc]
    OrchardError, requests.exceptions.HTTPError, aiohttp.ClientResponseError
):
    """The server answered with an error status (the base of the status classes below).

    Code written for Orchard's SDK catches these as it always did: each is also a
    ``requests.exceptions.HTTPError`` (``e.response`` is a ``requests.Response`` whose
    ``status_code``, ``text``, ``json()`` and ``headers`` work) and an
    ``aiohttp.ClientResponseError`` (``e.status``, ``e.message``, ``e.headers``), for
    the sync and the async client alike.
    """

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(detail, status=status, code=code, body=body)
        self._attach(b"", None, None, None)

    def _attach(
        self,
        body: bytes,
        headers: Mapping[str, str] | None,
        method: str | None,
        url: str | None,
    ) -> None:
        """Fills the attributes ``requests`` and ``aiohttp`` users read."""
        status = self.status or 0
        hdrs = dict(headers or {})
        self._wire = (body, hdrs, method, url)
        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        response = requests.Response()
        response.status_code = status
        response._content = body
        response.headers = requests.structures.CaseInsensitiveDict(hdrs)
        response.url = url or ""
        response.reason = reason
        response.encoding = "utf-8"
        self.response = response
        self.request = None
        # aiohttp.ClientResponseError's attributes (its __init__ is not called).
        self.message = self.detail
        self.headers = CIMultiDictProxy(CIMultiDict(hdrs))
        self.history = ()
        real = URL(url or "")
        self.request_info = aiohttp.RequestInfo(
            real, method or "", CIMultiDictProxy(CIMultiDict()), real
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (multiprocessing, Ray...) from what it was built of: the multidict
        # proxies aiohttp's attributes want cannot be pickled themselves.
        body, hdrs, method, url = self._wire
        return (
            _rebuild,
            (type(self), self.detail, self.status, self.code, self.body, body, hdrs, method, url),
        )


def _rebuild(
    cls: type[APIError],
    detail: str,
    status: int | None,
    code: str | None,
    parsed: Any,
    body: bytes,
    headers: dict[str, str],
    method: str | None,
    url: str | None,
) -> APIError:
    err = cls(detail, status=status, code=code, body=parsed)
    err._attach(body, headers, method, url)
    return err


class BadRequestError(APIError):
    """400 ``bad_request``: the request itself is wrong (a bad argument, id, label...).

    Also the base of the other request errors: 413 (:class:`BodyTooLargeError`), 422
    (:class:`UnprocessableError`) and the agent's 400 codes (``cwd_not_found``...).
    """


class BodyTooLargeError(BadRequestError):
    """413 ``body_too_large``: the body is larger than the route allows."""


class UnprocessableError(BadRequestError):
    """422 ``unprocessable``: the body is JSON of the wrong shape (a missing field...)."""


class AuthError(APIError):
    """401 ``unauthorized``: the API key (or sandbox token) is missing or wrong.

    Also the base of every 403 (:class:`PermissionDeniedError`).
    """


class PermissionDeniedError(AuthError):
    """403 ``permission_denied``: the sandbox's filesystem refused (a read-only path, a
    file the image user may not write), or the key may not change the shared images."""


class NotFoundError(APIError):
    """404 ``not_found``: no such sandbox, job, file, process, session or terminal."""


class ConflictError(APIError):
    """409 ``conflict``: the target exists already, or is in the wrong state (exited,
    not ready)."""


class OrchardTimeoutError(OrchardError, builtins.TimeoutError, requests.exceptions.Timeout):
    """A wait ran out: 408 from the server, or a client-side time limit.

    It is also a built-in :class:`TimeoutError`, so ``except TimeoutError`` catches it
    (and ``requests.exceptions.Timeout``, which Orchard's sync SDK raised).
    """


class RequestTimeoutError(OrchardTimeoutError, APIError):  # type: ignore[misc]
    """408 ``timeout``: a server-side wait ran out (an HTTP error and a
    :class:`TimeoutError`)."""


class QuotaError(APIError):
    """429 ``quota_exceeded``: a quota of the API key was hit; also the agent's
    concurrency limits (``too_many_execs``...)."""


class SandboxError(APIError, RuntimeError):  # type: ignore[misc]
    """502 ``sandbox_failed``: the sandbox could not start, or its agent could not be
    reached.

    Also a :class:`RuntimeError`, which is what Orchard's SDK raised for a failed sandbox.
    """


class TerminalError(OrchardError, RuntimeError):
    """A terminal session ended with an error instead of an exit (a ``RuntimeError``)."""


class SandboxDeletedError(OrchardError, RuntimeError):
    """The sandbox was used after :meth:`~orchard_env.SandboxInstance.delete`.

    A :class:`RuntimeError`, as in Orchard's SDK.
    """


class ServerError(APIError):
    """500 ``internal`` (or another 5xx without a class of its own): the server failed."""


class UnavailableError(APIError):
    """503 ``unavailable``: the server is overloaded; raised once the retries are used up."""


class NotImplementedByServerError(ServerError, NotImplementedError):  # type: ignore[misc]
    """501 ``not_implemented``: this server's backend cannot do what was asked (process
    checkpoints in a snapshot: CRIU does not work on its kernel; snapshots on a backend
    without them). Not transient: asking again gets the same answer.

    A :class:`ServerError` (what a 501 was before it had a class) and a built-in
    :class:`NotImplementedError`.
    """


class OrchardConnectionError(
    OrchardError,
    builtins.ConnectionError,
    requests.exceptions.ConnectionError,
    aiohttp.ClientConnectionError,
):
    """The server could not be reached, or the connection broke (after the retries).

    Also a built-in :class:`ConnectionError` (and the ``requests`` and ``aiohttp``
    connection errors). ``__cause__`` is the ``httpx`` error.
    """


_BY_STATUS: dict[int, type[OrchardError]] = {
    400: BadRequestError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    408: RequestTimeoutError,
    409: ConflictError,
    413: BadRequestError,
    422: BadRequestError,
    429: QuotaError,
    500: ServerError,
    501: NotImplementedByServerError,
    502: SandboxError,
    503: UnavailableError,
}

#: The class of each of the orchestrator's codes (``ServiceErrorCode`` in the Rust
#: ``protocol`` crate), one to one; ``tests/test_error_codes.py`` checks it against that
#: enum, so a code added on one side only fails there.
_BY_CODE: dict[str, type[APIError]] = {
    "bad_request": BadRequestError,
    "unauthorized": AuthError,
    "permission_denied": PermissionDeniedError,
    "not_found": NotFoundError,
    "timeout": RequestTimeoutError,
    "conflict": ConflictError,
    "body_too_large": BodyTooLargeError,
    "unprocessable": UnprocessableError,
    "quota_exceeded": QuotaError,
    "internal": ServerError,
    "sandbox_failed": SandboxError,
    "unavailable": UnavailableError,
    "not_implemented": NotImplementedByServerError,
}

_CODE_BY_STATUS = {
    400: "bad_request",
    401: "unauthorized",
    403: "unauthorized",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "body_too_large",
    422: "unprocessable",
    429: "quota_exceeded",
    500: "internal",
    501: "not_implemented",
    502: "sandbox_failed",
    503: "unavailable",
}


def _class_for(status: int, code: str | None = None) -> type[OrchardError]:
    """The class of an answer: its code's, or its status's when the code is unknown or
    does not go with the status (the class of a code never escapes the status's)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else BadRequestError if status >= 400 else APIError
    by_code = _BY_CODE.get(code) if code else None
    if by_code is not None and issubclass(by_code, cls):
        return by_code
    return cls


def error_from_body(
    status: int,
    body: bytes,
    *,
    headers: Mapping[str, str] | None = None,
    method: str | None = None,
    url: str | None = None,
) -> OrchardError:
    """Builds the exception for an error ``status`` and its raw ``body``.

    >>> e = error_from_body(404, b'{"detail": "no sandbox x", "code": "not_found"}')
    >>> type(e).__name__, e.detail
    ('NotFoundError', 'no sandbox x')
    >>> error_from_body(429, b'{"code": "too_many_execs", "message": "busy"}').code
    'too_many_execs'
    >>> type(error_from_body(403, b'{"detail": "read-only", "code": "permission_denied"}'))
    <class 'orchard_env.errors.PermissionDeniedError'>
    """
    parsed: Any = None
    detail: str | None = None
    code: str | None = None
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        raw_detail = parsed.get("detail", parsed.get("message"))
        if isinstance(raw_detail, str):
            detail = raw_detail
        elif raw_detail is not None:
            # FastAPI-style validation errors carry a list here.
            detail = json.dumps(raw_detail)
        raw_code = parsed.get("code")
        if isinstance(raw_code, str):
            code = raw_code
    if detail is None:
        text = body.decode("utf-8", "replace").strip()
        detail = text[:500] if text else f"HTTP {status}"
    code = code or _CODE_BY_STATUS.get(status)
    err = _class_for(status, code)(detail, status=status, code=code, body=parsed)
    if isinstance(err, APIError):
        err._attach(body, headers, method, url)
    return err


def error_from_response(response: httpx.Response) -> OrchardError:
    """Builds the exception for an error response whose body has been read."""
    request = response.request
    return error_from_body(
        response.status_code,
        response.content,
        headers=response.headers,
        method=request.method,
        url=str(request.url),
    )


_BY_CLOSE_CODE: dict[int, tuple[type[OrchardError], int, str]] = {
    4400: (BadRequestError, 400, "bad_request"),
    4401: (AuthError, 401, "unauthorized"),
    4404: (NotFoundError, 404, "not_found"),
    4409: (ConflictError, 409, "not_ready"),
    4500: (ServerError, 500, "spawn_failed"),
}


def error_from_close_code(close_code: int | None, reason: str) -> OrchardError:
    """Builds the exception for a WebSocket the server closed with an error code.

    >>> type(error_from_close_code(4404, "no sandbox")).__name__
    'NotFoundError'
    """
    if close_code is not None and close_code in _BY_CLOSE_CODE:
        cls, status, code = _BY_CLOSE_CODE[close_code]
        return cls(reason or code, status=status, code=code)
    return OrchardConnectionError(
        f"terminal connection closed (code {close_code}): {reason}".rstrip(": ")
    )

"""The exceptions of the SDK: one small hierarchy under :class:`OrchardError`.

Every error the server answers carries a JSON body: the orchestrator's
``{"detail": ..., "code": ...}``, or the agent's ``{"code": ..., "message": ...}`` on
proxied and direct ``/v1`` routes. :func:`error_from_response` turns either into the
exception class of its status code, keeping ``status``, ``code`` and ``detail``.

>>> try:
...     client.get_sandbox("no-such-sandbox")
... except NotFoundError as e:
...     print(e.status, e.code)
404 not_found
"""

from __future__ import annotations

import builtins
import json
from typing import Any

import httpx

__all__ = [
    "OrchardError",
    "APIError",
    "BadRequestError",
    "AuthError",
    "NotFoundError",
    "ConflictError",
    "OrchardTimeoutError",
    "QuotaError",
    "SandboxError",
    "ServerError",
    "UnavailableError",
    "OrchardConnectionError",
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

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.code:
            parts.append(self.code)
        prefix = " ".join(parts)
        return f"{prefix}: {self.detail}" if prefix else self.detail


class APIError(OrchardError):
    """The server answered with an error status (the base of the status classes below)."""


class BadRequestError(APIError):
    """400, 413 or 422: the request itself is wrong (bad argument, body too large...)."""


class AuthError(APIError):
    """401 or 403: the API key (or sandbox token) is missing or wrong."""


class NotFoundError(APIError):
    """404: no such sandbox, job, file, process, session or terminal."""


class ConflictError(APIError):
    """409: the target exists already, or is in the wrong state (exited, not ready)."""


class OrchardTimeoutError(OrchardError, builtins.TimeoutError):
    """A wait ran out: 408 from the server, or a client-side time limit.

    It is also a built-in :class:`TimeoutError`, so ``except TimeoutError`` catches it.
    """


class QuotaError(APIError):
    """429: a quota or a concurrency limit was hit (``quota_exceeded``, ``too_many_execs``)."""


class SandboxError(APIError):
    """502: the sandbox could not start, or its agent could not be reached."""


class ServerError(APIError):
    """500 (or another 5xx without a class of its own): the server failed."""


class UnavailableError(APIError):
    """503: the server is overloaded; raised once the retries are used up."""


class OrchardConnectionError(OrchardError, builtins.ConnectionError):
    """The server could not be reached, or the connection broke (after the retries).

    Also a built-in :class:`ConnectionError`. ``__cause__`` is the ``httpx`` error.
    """


_BY_STATUS: dict[int, type[OrchardError]] = {
    400: BadRequestError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    408: OrchardTimeoutError,
    409: ConflictError,
    413: BadRequestError,
    422: BadRequestError,
    429: QuotaError,
    500: ServerError,
    502: SandboxError,
    503: UnavailableError,
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
    502: "sandbox_failed",
    503: "unavailable",
}


def _class_for(status: int) -> type[OrchardError]:
    cls = _BY_STATUS.get(status)
    if cls is not None:
        return cls
    if status >= 500:
        return ServerError
    if status >= 400:
        return BadRequestError
    return APIError


def error_from_body(status: int, body: bytes) -> OrchardError:
    """Builds the exception for an error ``status`` and its raw ``body``.

    >>> e = error_from_body(404, b'{"detail": "no sandbox x", "code": "not_found"}')
    >>> type(e).__name__, e.detail
    ('NotFoundError', 'no sandbox x')
    >>> error_from_body(429, b'{"code": "too_many_execs", "message": "busy"}').code
    'too_many_execs'
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
    return _class_for(status)(
        detail, status=status, code=code or _CODE_BY_STATUS.get(status), body=parsed
    )


def error_from_response(response: httpx.Response) -> OrchardError:
    """Builds the exception for an error response whose body has been read."""
    return error_from_body(response.status_code, response.content)


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

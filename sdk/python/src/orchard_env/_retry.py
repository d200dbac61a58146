"""When a failed request is sent again, and after how long.

A request declares how safe it is to repeat (:class:`Idempotency`); the policy decides
from that and from the failure. The rule that matters: a request that may have reached
the server is repeated only when repeating it cannot do something twice. Running a
command is never repeated once its bytes may have left, only when the connection could
not even be opened (``ConnectError``, ``ConnectTimeout``) or no pooled connection was
free (``PoolTimeout``), or when the server answered 503 (which it only does for work it
did not start).
"""

from __future__ import annotations

import enum
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import httpx

__all__ = ["RetryPolicy", "Idempotency"]

log = logging.getLogger("orchard_env")


class Idempotency(enum.Enum):
    """How safe a request is to send again."""

    #: Repeating it has the same effect as sending it once (reads, deletes, waits,
    #: heartbeats, uploads of a whole body, creates with a client-chosen id).
    SAFE = "safe"
    #: Repeat it only if it certainly never reached the server (exec, apply, commit...).
    UNSENT = "unsent"


#: Errors raised before a single byte of the request was written.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: Other transient errors: the request may or may not have been processed.
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of transient failures: connection errors, time-outs and 503 answers.

    ``attempts`` is the number of retries after the first try (3 by default, so at
    most 4 sends). After a transport error the n-th retry waits a random time in
    ``[d/2, d]`` with ``d = min(max_backoff, backoff * 2**(n-1))`` (exponential backoff
    with jitter; ``backoff`` is Orchard's ``retry_delay``, 1 s). After a 503 it waits the
    answer's ``Retry-After`` (``retry_after_default``, 5 s, when absent; at most
    ``max_retry_after``) plus up to ``retry_after_jitter`` seconds, as Orchard's SDK
    does, so that many clients turned away together do not return together. ``on_retry``, when set,
    is called before each wait with the attempt number that failed, the error (an
    ``httpx`` exception, or ``None`` for a 503) and the delay.

    >>> policy = RetryPolicy(attempts=3, backoff=0.5, max_backoff=4)
    >>> 2.0 <= policy.delay_unavailable("2") <= 4.0
    True
    >>> [round(policy.max_delay(n), 2) for n in (1, 2, 3, 4, 5)]
    [0.5, 1.0, 2.0, 4.0, 4.0]
    >>> RetryPolicy(attempts=0).should_retry_error(Idempotency.SAFE, httpx.ConnectError("x"), 1)
    False
    """

    attempts: int = 3
    backoff: float = 1.0
    max_backoff: float = 8.0
    retry_after_default: float = 5.0
    retry_after_jitter: float = 2.0
    max_retry_after: float = 60.0
    on_retry: Callable[[int, BaseException | None, float], None] | None = None

    def max_delay(self, attempt: int) -> float:
        """Upper bound of the wait after failed attempt number ``attempt`` (from 1)."""
        return float(min(self.max_backoff, self.backoff * (2 ** (attempt - 1))))

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` (a transport error): jittered backoff."""
        top = self.max_delay(attempt)
        return random.uniform(top / 2, top)

    def delay_unavailable(self, retry_after: str | None) -> float:
        """The wait after a 503: its ``Retry-After`` (seconds) or the default, plus jitter."""
        base = self.retry_after_default
        if retry_after:
            try:
                parsed = float(retry_after)
            except ValueError:
                parsed = math.nan  # an HTTP date, or garbage: the default
            if math.isfinite(parsed):
                base = parsed
        base = max(0.0, min(base, self.max_retry_after))
        return base + random.uniform(0.0, max(0.0, self.retry_after_jitter))

    def should_retry_error(
        self, idempotency: Idempotency, error: BaseException, attempt: int
    ) -> bool:
        """Whether the transport ``error`` of attempt number ``attempt`` is retried."""
        if attempt > self.attempts:
            return False
        if isinstance(error, _NOT_SENT):
            return True
        if idempotency is Idempotency.SAFE and isinstance(error, _TRANSIENT):
            return True
        return False

    def should_retry_status(self, status: int, attempt: int) -> bool:
        """Whether an answer with ``status`` is retried (only 503: the server did nothing)."""
        return status == 503 and attempt <= self.attempts

    def notify(self, attempt: int, error: BaseException | None, delay: float) -> None:
        """Logs a retry and calls ``on_retry``."""
        log.info(
            "orchard_env: attempt %d failed (%s), retrying in %.2fs",
            attempt,
            error if error is not None else "503",
            delay,
        )
        if self.on_retry is not None:
            self.on_retry(attempt, error, delay)

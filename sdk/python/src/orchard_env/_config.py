"""Client configuration: arguments first, then ``SANDBOX_*`` environment variables."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

from ._retry import RetryPolicy

ENV_BASE_URL = "SANDBOX_BASE_URL"
ENV_API_KEY = "SANDBOX_API_KEY"
ENV_PREFIX = "SANDBOX_PREFIX"

#: The server when neither ``base_url`` nor ``SANDBOX_BASE_URL`` names one (Orchard's default).
DEFAULT_BASE_URL = "http://localhost:8000"

#: Prefix of the sandbox ids the SDK makes when ``SANDBOX_PREFIX`` is not set.
DEFAULT_PREFIX = "sandbox"


@dataclass(frozen=True)
class ClientConfig:
    """What a client needs to talk to one server; built by :func:`resolve_config`."""

    base_url: str
    api_key: str | None
    prefix: str
    timeout: float
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    direct: bool = False

    def __repr__(self) -> str:  # never print the key
        return (
            f"ClientConfig(base_url={self.base_url!r}, prefix={self.prefix!r}, "
            f"timeout={self.timeout!r}, direct={self.direct!r})"
        )


def resolve_config(
    base_url: str | None,
    api_key: str | None,
    prefix: str | None,
    timeout: float,
    retry: RetryPolicy | None,
    direct: bool,
) -> ClientConfig:
    """Fills what the caller did not give from the environment.

    >>> config = resolve_config("http://127.0.0.1:9/", "key", None, 30, None, False)
    >>> config.base_url, config.api_key
    ('http://127.0.0.1:9', 'key')
    """
    url = base_url or os.environ.get(ENV_BASE_URL) or DEFAULT_BASE_URL
    key = api_key if api_key is not None else os.environ.get(ENV_API_KEY) or None
    pfx = prefix if prefix is not None else os.environ.get(ENV_PREFIX) or DEFAULT_PREFIX
    return ClientConfig(
        base_url=url.rstrip("/"),
        api_key=key,
        prefix=pfx,
        timeout=float(timeout),
        retry=retry if retry is not None else RetryPolicy(),
        direct=direct,
    )


def new_sandbox_id(prefix: str) -> str:
    """A fresh sandbox id: ``<prefix>-<12 hex digits>``, lowercase, DNS-label safe.

    The SDK always picks the id itself, so that creating a sandbox can be retried
    after a dropped connection without ever making a second sandbox.

    >>> sid = new_sandbox_id("RL_run")
    >>> sid.startswith("rl-run-"), len(sid)
    (True, 19)
    """
    clean = "".join(c if c.isalnum() else "-" for c in prefix.lower()).strip("-") or DEFAULT_PREFIX
    return f"{clean[:40]}-{secrets.token_hex(6)}"

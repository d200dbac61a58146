"""State and routing shared by the sync and async clients (no I/O here)."""

from __future__ import annotations

import os

from . import _cleanup
from ._config import ClientConfig
from .errors import SandboxError
from .models import AgentEndpoint, SandboxInfo
from .pty import WsTarget

#: Seconds a client waits for a job beyond the job's own time limit.
JOB_WAIT_MARGIN = 30.0


class ClientState:
    """What both clients keep: the configuration and the sandboxes they own."""

    def __init__(self, config: ClientConfig, auto_cleanup: bool) -> None:
        self.config = config
        self.auto_cleanup = auto_cleanup
        #: Ids of the sandboxes this client created and has not deleted, in order.
        self.owned: dict[str, None] = {}

    def own(self, sandbox_id: str) -> None:
        """Tracks a sandbox this client creates (before the create is sent)."""
        self.owned[sandbox_id] = None
        if self.auto_cleanup:
            _cleanup.register(self.config.base_url, self.config.api_key, sandbox_id)

    def disown(self, sandbox_id: str) -> None:
        """Stops tracking a sandbox (deleted, or handed over with ``detach``)."""
        self.owned.pop(sandbox_id, None)
        _cleanup.unregister(self.config.base_url, self.config.api_key, sandbox_id)

    def job_wait_limit(self, timeout: float | None) -> float:
        """How long ``exec`` waits for a job: its time limit plus a margin, or the client's."""
        return self.config.timeout if timeout is None else timeout + JOB_WAIT_MARGIN

    def api_headers(self) -> dict[str, str]:
        """Auth header of the orchestrator."""
        return {"X-API-Key": self.config.api_key} if self.config.api_key else {}

    def ws_target(self, path: str) -> WsTarget:
        """The WebSocket route ``path`` on the server, with the key in the header and in
        the query (``?api_key=``, which the server's WebSocket routes also take)."""
        key = self.config.api_key
        return WsTarget.make(
            self.config.base_url, path, self.api_headers(), query={"api_key": key} if key else None
        )


def agent_socket(endpoint: AgentEndpoint) -> str | None:
    """The agent's Unix socket when it is reachable from here (same host)."""
    if endpoint.socket and os.path.exists(endpoint.socket):
        return endpoint.socket
    return None


def agent_target(endpoint: AgentEndpoint, path: str) -> WsTarget:
    """A WebSocket route of the agent itself."""
    headers = {"x-orchard-token": endpoint.token}
    uds = agent_socket(endpoint)
    if uds:
        return WsTarget.make("http://agent", path, headers, uds=uds)
    if not endpoint.url:
        raise ValueError("the sandbox's agent has neither a reachable socket nor a URL")
    return WsTarget.make(endpoint.url, path, headers)


def agent_key(endpoint: AgentEndpoint) -> tuple[str | None, str | None]:
    """Which connection pool an agent endpoint uses."""
    uds = agent_socket(endpoint)
    return (uds, None) if uds else (None, endpoint.url)


def describe(info: SandboxInfo | None, sandbox_id: str, direct: bool) -> str:
    """``repr`` of a sandbox."""
    status = info.status if info else None
    image = info.image if info else None
    extra = ", direct=True" if direct else ""
    return f"<sandbox {sandbox_id} image={image!r} status={status!r}{extra}>"


def check_started(info: SandboxInfo) -> None:
    """Raises :class:`SandboxError` when a wait answered with a sandbox that failed."""
    if info.status == "failed":
        raise SandboxError(
            f"sandbox {info.sandbox_id} failed: {info.status_message or 'no reason given'}",
            status=502,
            code="sandbox_failed",
        )

"""``orchard_env.client.sandbox_client``: Orchard's module path of the clients."""

from .._sync import SandboxClient, SandboxInstance
from ..aio import AsyncSandboxClient, AsyncSandboxInstance
from ..models import JobResult

#: Orchard's alias of :class:`SandboxClient`.
Sandbox = SandboxClient
#: Orchard's alias of :class:`AsyncSandboxClient`.
AsyncSandbox = AsyncSandboxClient

__all__ = [
    "SandboxClient",
    "AsyncSandboxClient",
    "SandboxInstance",
    "AsyncSandboxInstance",
    "JobResult",
    "Sandbox",
    "AsyncSandbox",
]

"""``orchard_env.client.sandbox_client``: Orchard's module path of the clients."""

from .. import (
    AsyncSandbox,
    AsyncSandboxClient,
    AsyncSandboxInstance,
    JobResult,
    Sandbox,
    SandboxClient,
    SandboxInstance,
)

__all__ = [
    "SandboxClient",
    "AsyncSandboxClient",
    "SandboxInstance",
    "AsyncSandboxInstance",
    "JobResult",
    "Sandbox",
    "AsyncSandbox",
]

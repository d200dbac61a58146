"""``orchard_env.client``: the clients, where Orchard's SDK keeps them.

Orchard code imports ``from orchard_env.client import SandboxClient, AsyncSandboxClient``
and the submodules :mod:`orchard_env.client.sandbox_client` and
:mod:`orchard_env.client.process`; all of them name the same classes as
``orchard_env`` itself (the async client is written in ``orchard_env.aio`` and the
``_aio_*`` modules it gathers; the sync one, ``orchard_env._sync`` and its ``_sync_*``
modules, is generated from them by ``scripts/unasync.py``).
"""

from .. import (
    AsyncContainerProcess,
    AsyncSandbox,
    AsyncSandboxClient,
    AsyncSandboxInstance,
    ContainerProcess,
    ExecStream,
    JobResult,
    Process,
    Sandbox,
    SandboxClient,
    SandboxInstance,
    Session,
    Terminal,
)

__all__ = [
    "SandboxClient",
    "AsyncSandboxClient",
    "SandboxInstance",
    "AsyncSandboxInstance",
    "JobResult",
    "ContainerProcess",
    "AsyncContainerProcess",
    "Sandbox",
    "AsyncSandbox",
    "ExecStream",
    "Process",
    "Session",
    "Terminal",
]

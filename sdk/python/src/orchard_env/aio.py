"""The asyncio client: :class:`AsyncSandboxClient` and :class:`AsyncSandboxInstance`.

The same methods as the sync client, awaitable; requests and answers go through the
same operations (``_ops``), only the I/O differs.

>>> async def main():
...     async with AsyncSandboxClient() as client:
...         async with client.create_sandbox("busybox:latest") as sandbox:
...             return (await sandbox.exec("echo async")).stdout
>>> asyncio.run(main())
'async\\n'
"""

from __future__ import annotations

from ._aio_client import AsyncSandboxClient
from ._aio_client import SandboxCreation as SandboxCreation
from ._aio_core import Command as Command
from ._aio_exec import AsyncExecStream, AsyncProcess
from ._aio_sandbox import AsyncSandboxInstance
from ._aio_sessions import AsyncSession, AsyncTerminal

__all__ = [
    "AsyncSandboxClient",
    "AsyncSandboxInstance",
    "AsyncExecStream",
    "AsyncProcess",
    "AsyncSession",
    "AsyncTerminal",
]

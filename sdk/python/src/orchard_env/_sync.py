# generated from aio.py by scripts/unasync.py; do not edit
"""The synchronous client: :class:`SandboxClient` and :class:`SandboxInstance`.

>>> with SandboxClient() as client:
...     with client.create_sandbox("busybox:latest") as sandbox:
...         print(sandbox.exec("echo 'Hello, Orchard!'").stdout)
Hello, Orchard!
<BLANKLINE>
"""

from __future__ import annotations

from ._sync_client import SandboxClient
from ._sync_core import Command as Command
from ._sync_exec import ExecStream, Process
from ._sync_sandbox import SandboxInstance
from ._sync_sessions import Session, Terminal

__all__ = [
    "SandboxClient",
    "SandboxInstance",
    "ExecStream",
    "Process",
    "Session",
    "Terminal",
]

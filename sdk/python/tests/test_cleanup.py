"""Sandboxes are deleted when the program that made them ends: by a signal or normally.

Each case runs a child Python process that creates a sandbox, prints its id, then
blocks on stdin; the test ends it and checks that the server no longer has the sandbox.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

PRELUDE = """
import asyncio, os, signal, sys
import orchard_env
"""

#: Creates a sandbox with the sync client, prints its id and blocks on stdin.
SYNC_MAIN = """
client = orchard_env.SandboxClient()
sb = client.create_sandbox("busybox:latest")
print(sb.sandbox_id, flush=True)
sys.stdin.read()
"""

SYNC_CHILD = PRELUDE + SYNC_MAIN

ASYNC_CHILD = (
    PRELUDE
    + """
async def main():
    client = orchard_env.AsyncSandboxClient()
    sb = await client.create_sandbox("busybox:latest")
    print(sb.sandbox_id, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
)

CHAINED_CHILD = (
    PRELUDE
    + """
def mine(signum, frame):
    print("previous handler ran", flush=True)
    os._exit(7)
signal.signal(signal.SIGTERM, mine)
"""
    + SYNC_MAIN
)


def run_child(code: str, server: Any) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    sandbox_id = proc.stdout.readline().strip()
    assert sandbox_id, f"child failed (exit {proc.wait()})"
    assert sandbox_id in server.sandbox_ids()
    return proc, sandbox_id


@pytest.mark.parametrize("code", [SYNC_CHILD, ASYNC_CHILD], ids=["sync", "async"])
def test_sigterm_leaves_no_sandbox(code: str, server: Any) -> None:
    proc, sandbox_id = run_child(code, server)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM  # it still dies of the signal
    assert sandbox_id not in server.sandbox_ids()


def test_sigint_leaves_no_sandbox(server: Any) -> None:
    proc, sandbox_id = run_child(SYNC_CHILD, server)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) != 0  # KeyboardInterrupt, as without the SDK
    assert sandbox_id not in server.sandbox_ids()


def test_previous_sigterm_handler_still_runs(server: Any) -> None:
    proc, sandbox_id = run_child(CHAINED_CHILD, server)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 7
    assert proc.stdout is not None and "previous handler ran" in proc.stdout.read()
    assert sandbox_id not in server.sandbox_ids()


def test_interpreter_exit_leaves_no_sandbox(server: Any) -> None:
    # Once stdin ends, the child falls off the end of its code without closing the
    # client: the atexit hook deletes the sandbox.
    proc, sandbox_id = run_child(SYNC_CHILD, server)
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert sandbox_id not in server.sandbox_ids()

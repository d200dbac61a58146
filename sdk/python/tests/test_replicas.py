"""Three ``orchard serve`` replicas over one Redis and one data directory, driven by the
SDK with the load spread over them: each sandbox is created through one replica, driven
through another and deleted through the third; jobs queued through different replicas
run in order; a wait on one replica ends with a job another ran; every replica sees the
same sandboxes.

``$ORCHARD_TEST_SERVE_ARGS`` (another backend) does not apply: the replicas share the
local backend's data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BUSYBOX, Server, running_server

from orchard_env import AsyncSandboxClient, SandboxClient

REPLICAS = 3
#: Concurrent flows (each: create, 5 ordered commands, a file, a job, delete: about
#: 300 calls in all).
FLOWS = 30


@contextlib.contextmanager
def redis_server(work: Path) -> Iterator[Path]:
    """A ``redis-server`` on a Unix socket in ``work``; answers the socket."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.access(binary, os.X_OK):
        pytest.fail("no redis-server: `make deps` (scripts/deps.sh) installs it")
    socket = work / "redis.sock"
    proc = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(socket), "--unixsocketperm", "700"]
        + ["--dir", str(work), "--save", "", "--appendonly", "no"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        # It says so on its output once it accepts connections.
        for line in proc.stdout:
            if b"ready to accept connections" in line.lower():
                break
        else:
            pytest.fail("redis-server did not start")
        # Keep draining its output so it never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield socket
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Server]]:
    """Redis and three replicas sharing it and one data directory."""
    work = Path(tempfile.mkdtemp(prefix="orchard-replicas-"))
    key = "test-" + secrets.token_hex(8)
    try:
        with redis_server(work) as socket, contextlib.ExitStack() as stack:
            state = ("--state", f"redis+unix://{socket}")
            servers = []
            for i in range(REPLICAS):
                # The first replica stops last (ExitStack unwinds in reverse) and then
                # deletes whatever a failed test left; the others keep the shared
                # sandboxes, the default with Redis.
                keep = ("--keep-sandboxes-on-exit", "false") if i == 0 else ()
                servers.append(
                    stack.enter_context(
                        running_server(
                            state + keep,
                            data_dir=work / "data",
                            api_key=key,
                            import_busybox=i == 0,
                        )
                    )
                )
            yield servers
            for s in servers:
                assert s.sandbox_ids() == [], f"left on {s.base_url}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def flow(i: int, clients: list[AsyncSandboxClient]) -> None:
    """One sandbox through all three replicas."""
    a, b, c = (clients[(i + k) % REPLICAS] for k in range(REPLICAS))
    sb = await a.create_sandbox(BUSYBOX)
    try:
        # Through B: commands in order, each seeing the one before.
        on_b = await b.get_sandbox(sb.id)
        for n in range(5):
            r = await on_b.exec(f"echo {i}-{n} >> /tmp/log && wc -l < /tmp/log")
            assert (r.exit_code, r.stdout.strip()) == (0, str(n + 1)), r
        await on_b.upload_content(f"hello {i}", "/tmp/f")
        # Through C: B's file, and a job queued here that A's wait sees end.
        on_c = await c.get_sandbox(sb.id)
        assert await on_c.download_content("/tmp/f") == f"hello {i}".encode()
        queued = await on_c.exec("cat /tmp/f; echo", wait=False)
        on_a = await a.get_sandbox(sb.id)
        done = await on_a.wait_job(queued.job_id, timeout=60)
        assert (done.status, done.stdout) == ("succeeded", f"hello {i}\n"), done
    finally:
        await c.delete_sandbox(sb.id)
    assert all(s.sandbox_id != sb.id for s in await b.list_sandboxes())


async def test_sdk_load_spread_over_three_replicas(replicas: list[Server]) -> None:
    key = replicas[0].api_key
    clients = [AsyncSandboxClient(base_url=r.base_url, api_key=key) for r in replicas]
    try:
        await asyncio.gather(*(flow(i, clients) for i in range(FLOWS)))
    finally:
        for cl in clients:
            await cl.close()


def test_the_sync_client_on_one_replica_and_another(replicas: list[Server]) -> None:
    key = replicas[0].api_key
    with SandboxClient(base_url=replicas[1].base_url, api_key=key) as one:
        with one.create_sandbox(BUSYBOX) as sb:
            with SandboxClient(base_url=replicas[2].base_url, api_key=key) as other:
                same = other.get_sandbox(sb.id)
                assert same.exec("echo across").stdout == "across\n"
                ids = {s.sandbox_id for s in other.list_sandboxes()}
                assert sb.id in ids

"""A soak: a long session with idle gaps between calls, as an RL rollout has while the
model thinks, checked for spurious connection errors.

Pooled connections idle during the gaps. A load balancer or proxy between trainer and
service closes connections idle longer than its timeout (60 s is common); a client
that reuses such a connection without noticing gets a reset or "server disconnected"
on a call that did nothing wrong. :class:`IdleProxy` is such a proxy (TCP level, any
byte either way counts as activity; it closes with FIN, or with RST like some load
balancers), and :func:`soak_sync` / :func:`soak_async` run rounds of the calls users
make (compatible and ``/v1``, direct to the agent too), an idle gap before each round,
and record every call's time and every error. ``make test`` runs a short soak through
a 1 s proxy; ``make bench`` a long one with gaps past 60 s (``bench/soak.py``).
"""

from __future__ import annotations

import asyncio
import selectors
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from orchard_env import AsyncSandboxClient, SandboxClient


class IdleProxy:
    """Forwards TCP connections to ``upstream``; closes both sides of a connection that
    has moved no byte for ``idle_s`` seconds (``rst=True``: with a reset)."""

    def __init__(self, upstream: str, idle_s: float, rst: bool = False) -> None:
        up = urlsplit(upstream)
        self._up = (up.hostname or "127.0.0.1", up.port or 80)
        self.idle_s = idle_s
        self.rst = rst
        self.closed_idle = 0  # connections this proxy closed for idling
        self._lock = threading.Lock()  # protects closed_idle
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._up, timeout=10)
        except OSError:
            client.close()
            return
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, client)
        last = time.monotonic()
        idle = False
        try:
            while not self._stop:
                events = sel.select(timeout=min(0.1, self.idle_s))
                if not events:
                    if time.monotonic() - last >= self.idle_s:
                        idle = True
                        return
                    continue
                for key, _ in events:
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
                    last = time.monotonic()
        except OSError:
            return
        finally:
            sel.close()
            for s in (client, upstream):
                if idle and self.rst:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            if idle:
                with self._lock:
                    self.closed_idle += 1


@dataclass
class SoakResult:
    """What a soak saw."""

    calls: int = 0
    errors: list[str] = field(default_factory=list)
    #: Seconds of the first call after each gap, and of the calls after it.
    first_after_idle: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)

    def merge(self, other: SoakResult) -> None:
        self.calls += other.calls
        self.errors += other.errors
        self.first_after_idle += other.first_after_idle
        self.warm += other.warm


def _round_calls_sync(
    client: SandboxClient, sb: Any, direct: Any, i: int
) -> list[Callable[[], None]]:
    def expect(got: object, want: object, what: str) -> None:
        if got != want:
            raise AssertionError(f"{what}: {got!r} != {want!r}")

    def compat_exec() -> None:
        expect(sb.exec(f"echo round-{i}").stdout, f"round-{i}\n", "exec")

    def files() -> None:
        sb.upload_content(f"payload {i}", "/workspace/soak.txt")
        expect(sb.download_content("/workspace/soak.txt"), f"payload {i}".encode(), "download")
        expect(any(f["name"] == "soak.txt" for f in sb.list_files("/workspace")), True, "list")

    def status() -> None:
        expect(client.health()["status"], "healthy", "health")
        sb.heartbeat()

    def v1_run() -> None:
        expect(sb.run(f"echo v1-{i}").stdout, f"v1-{i}\n", "/v1 run")

    def direct_run() -> None:
        expect(direct.run(f"echo direct-{i}").stdout, f"direct-{i}\n", "direct run")

    def terminal() -> None:
        proc = sb.exec("cat", pty=True)
        try:
            proc.write_stdin(f"tty-{i}\n")
            seen = proc.read_until(f"tty-{i}", timeout=10)
            expect(f"tty-{i}".encode() in seen, True, "terminal echo")
        finally:
            proc.kill()
            proc.close()

    return [compat_exec, files, status, v1_run, direct_run, terminal]


def soak_sync(base_url: str, api_key: str, image: str, rounds: int, gap_s: float) -> SoakResult:
    """``rounds`` rounds of calls with the sync client on one sandbox, ``gap_s`` idle
    seconds before each."""
    result = SoakResult()
    with SandboxClient(base_url=base_url, api_key=api_key) as client:
        with client.create_sandbox(image) as sb:
            direct = client.get_sandbox(sb.sandbox_id, direct=True)
            for i in range(rounds):
                time.sleep(gap_s)
                for n, call in enumerate(_round_calls_sync(client, sb, direct, i)):
                    start = time.perf_counter()
                    try:
                        call()
                    except Exception as e:  # noqa: BLE001 - every error is the finding
                        result.errors.append(f"sync round {i} {call.__name__}: {e!r}")
                    took = time.perf_counter() - start
                    result.calls += 1
                    (result.first_after_idle if n == 0 else result.warm).append(took)
    return result


def _round_calls_async(
    client: AsyncSandboxClient, sb: Any, direct: Any, i: int
) -> list[Callable[[], Awaitable[None]]]:
    async def compat_exec() -> None:
        job = await sb.exec(f"echo round-{i}")
        assert job.stdout == f"round-{i}\n", job.stdout

    async def files() -> None:
        await sb.upload_content(f"payload {i}", "/workspace/soak.txt")
        got = await sb.download_content("/workspace/soak.txt")
        assert got == f"payload {i}".encode(), got

    async def status() -> None:
        assert (await client.health())["status"] == "healthy"
        await sb.heartbeat()

    async def v1_run() -> None:
        assert (await sb.run(f"echo v1-{i}")).stdout == f"v1-{i}\n"

    async def direct_run() -> None:
        assert (await direct.run(f"echo d-{i}")).stdout == f"d-{i}\n"

    return [compat_exec, files, status, v1_run, direct_run]


async def soak_async(
    base_url: str, api_key: str, image: str, rounds: int, gap_s: float
) -> SoakResult:
    """The same with the async client."""
    result = SoakResult()
    async with AsyncSandboxClient(base_url=base_url, api_key=api_key) as client:
        sb = await client.create_sandbox(image)
        direct = await client.get_sandbox(sb.sandbox_id, direct=True)
        try:
            for i in range(rounds):
                await asyncio.sleep(gap_s)
                calls = _round_calls_async(client, sb, direct, i)
                for n, call in enumerate(calls):
                    start = time.perf_counter()
                    try:
                        await call()
                    except Exception as e:  # noqa: BLE001 - every error is the finding
                        result.errors.append(f"async round {i} {call.__name__}: {e!r}")
                    took = time.perf_counter() - start
                    result.calls += 1
                    (result.first_after_idle if n == 0 else result.warm).append(took)
        finally:
            await sb.delete()
    return result

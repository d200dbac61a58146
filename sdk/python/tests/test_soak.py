"""The short soak (``make test``): rounds of calls with idle gaps, through a proxy that
closes idle connections (FIN or RST), and straight to the server with gaps past the
pool's own keep-alive expiry. No call may fail. ``make bench`` runs the long one."""

from __future__ import annotations

import time
from typing import Any

import pytest
from soak import IdleProxy, SoakResult, soak_async, soak_sync

from orchard_env import SandboxClient

BUSYBOX = "busybox:latest"


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_calls_after_a_proxy_closed_idle_connections_never_fail(
    server: Any, flavor: str, rst: bool
) -> None:
    proxy = IdleProxy(server.base_url, idle_s=1.0, rst=rst)
    try:
        rounds = 3
        if flavor == "sync":
            r = soak_sync(proxy.url, server.api_key, BUSYBOX, rounds=rounds, gap_s=1.6)
        else:
            r = await soak_async(proxy.url, server.api_key, BUSYBOX, rounds=rounds, gap_s=1.6)
        assert r.errors == [], r.errors
        assert r.calls >= rounds * 5
        # The proxy did close the pool's connections while they idled.
        assert proxy.closed_idle >= rounds, proxy.closed_idle
    finally:
        proxy.close()


async def test_calls_after_idling_past_the_pool_expiry_never_fail(server: Any) -> None:
    # Straight to the server: gaps longer than httpx's keep-alive expiry (5 s), so the
    # pools drop and reopen connections between rounds.
    total = SoakResult()
    total.merge(soak_sync(server.base_url, server.api_key, BUSYBOX, rounds=2, gap_s=5.5))
    total.merge(await soak_async(server.base_url, server.api_key, BUSYBOX, rounds=2, gap_s=5.5))
    assert total.errors == [], total.errors


def test_a_terminal_left_quiet_past_a_proxy_idle_timeout_still_answers(server: Any) -> None:
    # A model thinking for a while: the terminal moves no byte for 30 s, longer than the
    # proxy's 25 s idle timeout. The server's pings (every 20 s) keep it open.
    proxy = IdleProxy(server.base_url, idle_s=25.0, rst=True)
    try:
        with SandboxClient(base_url=proxy.url, api_key=server.api_key) as client:
            with client.create_sandbox(BUSYBOX) as sb:
                proc = sb.exec("cat", pty=True)
                try:
                    proc.write_stdin("before\n")
                    assert b"before" in proc.read_until("before", timeout=10)
                    time.sleep(30)
                    proc.write_stdin("after\n")
                    assert b"after" in proc.read_until("after", timeout=10)
                finally:
                    proc.kill()
                    proc.close()
    finally:
        proxy.close()

"""The short soak (``make test``): rounds of calls with idle gaps, through a proxy that
closes idle connections (FIN or RST), and straight to the server with gaps past the
pool's own keep-alive expiry. No call may fail. ``make bench`` runs the long one."""

from __future__ import annotations

from typing import Any

import pytest
from soak import IdleProxy, SoakResult, soak_async, soak_sync

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

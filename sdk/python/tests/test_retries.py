"""Retries against a server that drops connections and answers 503 (a flaky proxy).

What must hold: reads, waits, deletes and creates (the SDK picks the id) survive
dropped connections; a command is sent again only when the connection could not be
opened (or the server said 503), never when the request may have reached the server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flaky_proxy import FlakyProxy
from helpers import aw

from orchard_env import (
    AsyncSandboxClient,
    AsyncSandboxInstance,
    OrchardConnectionError,
    RetryPolicy,
    SandboxClient,
    SandboxInstance,
    UnavailableError,
)

BUSYBOX = "busybox:latest"
FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05, retry_after_jitter=0.01)


@pytest.fixture
def proxy(server: Any) -> Iterator[FlakyProxy]:
    p = FlakyProxy(server.base_url)
    yield p
    p.close()


@pytest.fixture
def target(client: SandboxClient) -> Iterator[SandboxInstance]:
    """A sandbox made through the real server, used through the proxy."""
    with client.create_sandbox(BUSYBOX) as sb:
        yield sb


def make_client(flavor: str, url: str, retry: RetryPolicy = FAST) -> Any:
    cls = SandboxClient if flavor == "sync" else AsyncSandboxClient
    return cls(base_url=url, retry=retry)


def via(client: Any, sandbox: SandboxInstance) -> Any:
    """The same sandbox, reached through ``client`` (no request made)."""
    cls = SandboxInstance if isinstance(client, SandboxClient) else AsyncSandboxInstance
    return cls(client, sandbox.info)


FLAVORS = pytest.mark.parametrize("flavor", ["sync", "async"])


@FLAVORS
async def test_reads_survive_dropped_connections(
    flavor: str, proxy: FlakyProxy, target: Any
) -> None:
    proxy.listen()
    proxy.add("GET", f"/sandboxes/{target.id}", "drop", times=2)
    proxy.add("GET", "/health", "drop_after", times=3)
    client = make_client(flavor, proxy.url)
    try:
        assert (await aw(client.get_sandbox(target.id))).id == target.id
        assert proxy.count("GET", f"/sandboxes/{target.id}") == 3
        assert (await aw(client.health()))["status"] == "healthy"
        assert proxy.count("GET", "/health") == 4  # 3 lost answers, then one that arrived
    finally:
        await aw(client.close())


@FLAVORS
async def test_503_is_retried_even_for_exec(flavor: str, proxy: FlakyProxy, target: Any) -> None:
    proxy.listen()
    proxy.add("POST", f"/sandboxes/{target.id}/exec", "503", times=2)
    client = make_client(flavor, proxy.url)
    try:
        sb = via(client, target)
        result = await aw(sb.exec("echo ran >> /tmp/count; cat /tmp/count"))
        assert result.stdout == "ran\n"  # sent 3 times, ran once
        assert proxy.count("POST", f"/sandboxes/{target.id}/exec") == 3
    finally:
        await aw(client.close())


@FLAVORS
async def test_exec_is_not_resent_once_it_may_have_arrived(
    flavor: str, proxy: FlakyProxy, target: Any
) -> None:
    proxy.listen()
    proxy.add("POST", f"/sandboxes/{target.id}/exec", "drop_after")
    proxy.add("POST", f"/sandboxes/{target.id}/exec", "drop")
    proxy.add("POST", f"/v1/sandboxes/{target.id}/exec", "drop_after")
    client = make_client(flavor, proxy.url)
    try:
        sb = via(client, target)
        with pytest.raises(OrchardConnectionError):
            await aw(sb.exec("echo a >> /tmp/jobs"))  # reached the server: it ran
        with pytest.raises(OrchardConnectionError):
            await aw(sb.exec("echo b >> /tmp/jobs"))  # never forwarded: it did not run
        with pytest.raises(OrchardConnectionError):
            await aw(sb.run("echo c >> /tmp/jobs"))
        assert proxy.count("POST", f"/sandboxes/{target.id}/exec") == 2
        assert proxy.count("POST", f"/v1/sandboxes/{target.id}/exec") == 1
        # Jobs of a sandbox run in order, so this one sees the first one's effect.
        assert target.exec("cat /tmp/jobs").stdout in ("a\nc\n", "c\na\n")
    finally:
        await aw(client.close())


@FLAVORS
async def test_exec_is_resent_when_the_connection_was_refused(
    flavor: str, proxy: FlakyProxy, target: Any
) -> None:
    # The proxy is bound but not listening: the first connect is refused; the retry hook
    # then opens it, so the second attempt goes through.
    retries: list[tuple[int, str]] = []

    def on_retry(attempt: int, error: BaseException | None, delay: float) -> None:
        retries.append((attempt, type(error).__name__))
        proxy.listen()

    client = make_client(flavor, proxy.url, RetryPolicy(backoff=0.01, on_retry=on_retry))
    try:
        sb = via(client, target)
        result = await aw(sb.exec("echo once >> /tmp/refused; cat /tmp/refused"))
        assert result.stdout == "once\n"
        assert retries == [(1, "ConnectError")]
    finally:
        await aw(client.close())


@FLAVORS
async def test_create_and_delete_survive_lost_answers(
    flavor: str, proxy: FlakyProxy, server: Any
) -> None:
    proxy.listen()
    proxy.add("POST", "/sandboxes", "drop_after")
    proxy.add("DELETE", "/sandboxes/", "drop_after")
    client = make_client(flavor, proxy.url)
    try:
        before = set(server.sandbox_ids())
        sb = await aw(client.create_sandbox(BUSYBOX))
        made = set(server.sandbox_ids()) - before
        assert made == {sb.id}  # the retry found the first sandbox instead of a second one
        assert proxy.count("POST", "/sandboxes") == 2
        await aw(client.delete_sandbox(sb.id))  # the retry's 404 means "deleted"
        assert proxy.count("DELETE", f"/sandboxes/{sb.id}") == 2
        assert sb.id not in server.sandbox_ids()
    finally:
        await aw(client.close())


@FLAVORS
async def test_retries_run_out(flavor: str, proxy: FlakyProxy) -> None:
    proxy.listen()
    proxy.add("GET", "/health", "503", times=10)
    proxy.add("GET", "/resources", "drop", times=10)
    client = make_client(flavor, proxy.url)
    try:
        with pytest.raises(UnavailableError):
            await aw(client.health())
        assert proxy.count("GET", "/health") == 4  # the try and 3 retries
        with pytest.raises(OrchardConnectionError):
            await aw(client.resources())
        assert proxy.count("GET", "/resources") == 4
    finally:
        await aw(client.close())

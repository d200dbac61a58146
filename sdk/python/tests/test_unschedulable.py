"""Waiting for a node, without a server: a fake orchestrator (an ``httpx.MockTransport``)
answers as ``orchard serve --backend kubernetes`` does for a sandbox no node can take
yet: ``/wait`` times out (408) while ``GET /sandboxes/{id}`` says ``unschedulable`` with
the scheduler's reason. The create keeps waiting and prints Orchard's line; only
``failed`` or the create's own time limit end it, and then the sandbox is deleted. The
Kubernetes test cluster runs the server's side of this for real
(``orchestrator/tests/kubernetes/server.rs``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from helpers import aw

import orchard_env
from orchard_env import AsyncSandboxClient, SandboxClient, _aio_client, _ops, _sync_client
from orchard_env.errors import OrchardTimeoutError, SandboxError

BASE = "http://orchard.invalid"
WHY = "0/1 nodes are available: 1 Insufficient cpu."


class FakeOrchestrator:
    """Answers the compatible routes a create uses; each ``/wait`` answers the next of
    ``waits`` (the last one repeats): ``"408"`` (still not ready), ``"ready"`` or
    ``"failed"``."""

    def __init__(self, waits: list[str]) -> None:
        self.waits = list(waits)
        self.sandbox_id = ""
        self.deleted: list[str] = []

    def sandbox(self, status: str, message: str = "") -> dict[str, Any]:
        return {
            "sandbox_id": self.sandbox_id,
            "image": "busybox:latest",
            "status": status,
            "status_message": message,
            "ready": status == "ready",
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path
        if method == "POST" and path == "/sandboxes":
            self.sandbox_id = json.loads(request.content)["sandbox_id"]
            return httpx.Response(200, json=self.sandbox("pending", "the sandbox is starting"))
        if method == "GET" and path.endswith("/wait"):
            answer = self.waits.pop(0) if len(self.waits) > 1 else self.waits[0]
            if answer == "408":
                return httpx.Response(408, json={"detail": "not ready yet", "code": "timeout"})
            if answer == "failed":
                why = f"the sandbox was not ready within 1 s (unschedulable: {WHY})"
                return httpx.Response(
                    502,
                    json={
                        "detail": f"sandbox {self.sandbox_id} failed to start: {why}",
                        "code": "sandbox_failed",
                    },
                )
            return httpx.Response(200, json=self.sandbox("ready"))
        if method == "GET" and path == f"/sandboxes/{self.sandbox_id}":
            return httpx.Response(200, json=self.sandbox("unschedulable", WHY))
        if method == "DELETE":
            self.deleted.append(path.rsplit("/", 1)[-1])
            return httpx.Response(200, json={"status": "deleted", "sandbox_id": self.sandbox_id})
        return httpx.Response(404, json={"detail": f"{method} {path}", "code": "not_found"})


@pytest.fixture(params=["sync", "async"])
def client_of(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Makes a client (sync, then async) whose requests the given fake answers."""

    def make(fake: FakeOrchestrator) -> Any:
        transport = httpx.MockTransport(fake)

        def make_http(config: Any, *, asynchronous: bool) -> httpx.Client | httpx.AsyncClient:
            kind = httpx.AsyncClient if asynchronous else httpx.Client
            return kind(base_url=config.base_url, transport=transport)

        monkeypatch.setattr(_sync_client, "make_http", make_http)
        monkeypatch.setattr(_aio_client, "make_http", make_http)
        kind = SandboxClient if request.param == "sync" else AsyncSandboxClient
        return kind(base_url=BASE, api_key="k", auto_cleanup=False)

    return make


def waiting_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "Waiting for node" in line]


async def test_a_create_waits_while_unschedulable_and_says_so(
    client_of: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every look reports (no 30 s between them), so both unschedulable answers print.
    monkeypatch.setattr(_ops, "NODE_REPORT_EVERY", 0.0)
    fake = FakeOrchestrator(["408", "408", "ready"])
    client = client_of(fake)
    sb = await aw(client.create_sandbox("busybox:latest"))
    assert sb.info.status == "ready"
    assert fake.deleted == []
    assert (
        waiting_lines(capsys.readouterr().out)
        == [f"[{sb.sandbox_id}] Waiting for node... (0s elapsed): {WHY}"] * 2
    )
    await aw(client.close(cleanup=False))


async def test_the_waiting_line_is_printed_at_most_every_30_s(
    client_of: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeOrchestrator(["408", "408", "408", "ready"])
    client = client_of(fake)
    sb = await aw(client.create_sandbox("busybox:latest"))
    assert sb.info.status == "ready"
    assert len(waiting_lines(capsys.readouterr().out)) == 1
    await aw(client.close(cleanup=False))


async def test_failed_still_ends_the_wait_and_the_sandbox_is_deleted(client_of: Any) -> None:
    fake = FakeOrchestrator(["408", "failed"])
    client = client_of(fake)
    with pytest.raises(SandboxError) as raised:
        await aw(client.create_sandbox("busybox:latest"))
    assert "unschedulable: " + WHY in str(raised.value)
    assert fake.deleted == [fake.sandbox_id]
    await aw(client.close(cleanup=False))


async def test_the_creates_own_time_limit_ends_the_wait_and_deletes_the_sandbox(
    client_of: Any,
) -> None:
    fake = FakeOrchestrator(["408"])
    client = client_of(fake)
    with pytest.raises(OrchardTimeoutError):
        await aw(client.create_sandbox("busybox:latest", timeout=0.01))
    assert fake.deleted == [fake.sandbox_id]
    await aw(client.close(cleanup=False))


def test_the_line_is_orchards() -> None:
    assert orchard_env._ops.waiting_for_node("sb-9", 61.9, WHY) == (
        f"[sb-9] Waiting for node... (61s elapsed): {WHY}"
    )

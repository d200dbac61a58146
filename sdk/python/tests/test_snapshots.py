"""Pause and resume, snapshots and forks, once through the sync client and once through
the async one (``box``/``any_client``, ``aw``/``ctx`` as in ``test_methods``), against
the session's real server.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import BUSYBOX, Server, running_server
from helpers import aw, ctx

from orchard_env import (
    AsyncSandboxClient,
    AsyncSandboxInstance,
    ConflictError,
    NotFoundError,
    NotImplementedByServerError,
    QuotaError,
    SandboxClient,
    SandboxInstance,
    ServerError,
    Snapshot,
    _cleanup,
)
from orchard_env.errors import error_from_response

STATE = "/workspace/state.txt"


def mark(sandbox: Any) -> dict[str, str]:
    """Labels that make a snapshot of ``sandbox`` its own: snapshots are content-addressed,
    so an equal capture made by another test would be answered instead."""
    return {"test-sandbox": sandbox.id}


async def test_a_paused_sandbox_refuses_calls_until_resumed(box: Any) -> None:
    assert (await aw(box.run("echo up"))).stdout == "up\n"
    info = await aw(box.pause())
    assert (info.paused, info.status, box.paused, box.info is info) == (True, "paused", True, True)
    assert (await aw(box.pause())).paused  # pausing a paused sandbox is harmless
    with pytest.raises(ConflictError) as refused:
        await aw(box.run("echo no"))
    assert refused.value.status == 409 and "paused" in refused.value.detail
    with pytest.raises(ConflictError) as compat:
        await aw(box.exec("echo no"))  # the compatible jobs route too
    assert "paused" in compat.value.detail
    with pytest.raises(ConflictError):
        await aw(box.write_file("/workspace/x", b"no"))
    assert (await aw(box.refresh())).paused  # refreshes keep reporting it

    info = await aw(box.resume())
    assert (info.paused, info.status, box.paused) == (False, "running", False)
    assert (await aw(box.run("echo back"))).stdout == "back\n"
    assert (await aw(box.exec("echo back"))).stdout == "back\n"
    assert not (await aw(box.refresh())).paused
    assert (await aw(box.resume())).status == "running"  # resuming a running one is harmless


async def test_forks_get_the_files_and_sessions_and_diverge(any_client: Any) -> None:
    parent = await aw(any_client.create_sandbox(BUSYBOX))
    await aw(parent.write_file(STATE, "turn 3\n"))
    session = await aw(parent.create_session())
    await aw(session.run("mkdir -p /workspace/sub && cd /workspace/sub && export TURN=3"))
    await aw(parent.start_process("sleep 1000"))  # a running process: not carried over

    snap = await aw(parent.snapshot(labels={"turn": "3", **mark(parent)}))
    assert isinstance(snap, Snapshot) and snap.id.startswith("snap-")
    assert (snap.sandbox_id, snap.labels["turn"], snap.processes) == (parent.id, "3", "none")
    assert snap.digest.startswith("sha256:") and snap.layers and snap.forks == []
    assert snap.size_bytes > 0 and snap.total_bytes >= snap.size_bytes
    captured = {s.id: s for s in snap.sessions}
    assert captured[session.id].cwd == "/workspace/sub"
    assert captured[session.id].env["TURN"] == "3"
    assert snap.id in [s.id for s in await aw(any_client.list_snapshots())]
    assert (await aw(any_client.get_snapshot(snap.id))).digest == snap.digest

    # A Snapshot or its id.
    source = snap if isinstance(any_client, SandboxClient) else snap.snapshot_id
    forks = await aw(any_client.fork(source, 3, labels={"branch": "x"}))
    handle = AsyncSandboxInstance if isinstance(any_client, AsyncSandboxClient) else SandboxInstance
    assert len(forks) == 3 and all(isinstance(f, handle) for f in forks)
    ids = [f.id for f in forks]
    assert len(set(ids) | {parent.id}) == 4
    for f in forks:
        assert f.info.ready and f.info.status == "running" and not f.paused
        assert f.info.labels.get("branch") == "x"
        assert f.id in any_client.owned_sandboxes and f.id in _cleanup.pending()
        assert await aw(f.read_file(STATE)) == b"turn 3\n"
        shell = await aw(f.get_session(session.id))
        assert (await aw(shell.run("echo $PWD $TURN"))).stdout == "/workspace/sub 3\n"
        assert await aw(f.list_processes()) == []

    # Each fork writes to its own layer: the others and the parent do not see it.
    await aw(forks[0].write_file(STATE, "turn 4 in fork 0\n"))
    assert await aw(forks[0].read_file(STATE)) == b"turn 4 in fork 0\n"
    assert await aw(forks[1].read_file(STATE)) == b"turn 3\n"
    assert await aw(parent.read_file(STATE)) == b"turn 3\n"
    await aw(parent.write_file(STATE, "parent moved on\n"))
    assert await aw(forks[2].read_file(STATE)) == b"turn 3\n"

    # Not deletable while forks of it exist.
    assert sorted((await aw(any_client.get_snapshot(snap))).forks) == sorted(ids)
    with pytest.raises(ConflictError) as in_use:
        await aw(any_client.delete_snapshot(snap))
    assert in_use.value.status == 409
    async with ctx(forks[0]):
        pass  # a fork is a context manager like a created sandbox: deleted on exit
    assert forks[0].id not in any_client.owned_sandboxes
    with pytest.raises(ConflictError):
        await aw(any_client.delete_snapshot(snap.id))
    # The client's cleanup deletes the forks it made, like the sandboxes it created.
    assert sorted(await aw(any_client.cleanup_all())) == sorted([parent.id, *ids[1:]])
    assert not set(ids) & set(_cleanup.pending())

    freed = await aw(any_client.delete_snapshot(snap))
    assert isinstance(freed, int) and freed >= 0
    with pytest.raises(NotFoundError):
        await aw(any_client.get_snapshot(snap))
    with pytest.raises(NotFoundError):
        await aw(any_client.fork(snap, 1))
    assert any_client.owned_sandboxes == []


async def test_a_fork_of_a_fork_and_a_snapshot_outliving_its_sandbox(any_client: Any) -> None:
    async with ctx(any_client.create_sandbox(BUSYBOX)) as first:
        await aw(first.write_file("/workspace/a", "a"))
        base = await aw(first.snapshot(mark(first)))
    [child] = await aw(any_client.fork(base, 1))  # its sandbox is gone: the snapshot is not
    async with ctx(child):
        await aw(child.write_file("/workspace/b", "b"))
        top = await aw(child.snapshot(mark(child)))
        assert top.parent_snapshot_id == base.id and len(top.layers) > len(base.layers)
    [grandchild] = await aw(any_client.fork(top, 1))
    async with ctx(grandchild):
        assert await aw(grandchild.read_file("/workspace/a")) == b"a"
        assert await aw(grandchild.read_file("/workspace/b")) == b"b"
    assert await aw(any_client.delete_snapshot(top)) >= 0
    assert await aw(any_client.delete_snapshot(base)) >= 0


def test_forks_get_bash_functions_back(client: SandboxClient, python_image: str) -> None:
    with client.create_sandbox(python_image) as parent:
        shell = parent.create_session(shell="/bin/bash")
        shell.run('greet() { echo "hi $1 from $PWD"; }; cd /usr && export WHO=fork')
        snap = parent.snapshot(mark(parent))
    [saved] = [s for s in snap.sessions if s.id == shell.id]
    assert "greet" in saved.functions and saved.shell == "/bin/bash"
    [fork] = client.fork(snap, 1)
    with fork:
        again = fork.get_session(shell.id)
        assert again.run('greet "$WHO"').stdout == "hi fork from /usr\n"
    client.delete_snapshot(snap)


def test_process_checkpoints_are_not_implemented(sandbox: SandboxInstance, server: Server) -> None:
    # The SDK never asks for them (no server here can take them); the server's answer
    # maps to its own class, a ServerError and a NotImplementedError.
    with server.http() as http:
        answer = http.post(f"/v1/sandboxes/{sandbox.id}/snapshots", json={"processes": True})
    assert answer.status_code == 501
    err = error_from_response(answer)
    assert isinstance(err, NotImplementedByServerError)
    assert isinstance(err, ServerError) and isinstance(err, NotImplementedError)
    assert (err.status, err.code) == (501, "not_implemented") and "CRIU" in err.detail


def test_the_snapshot_quota_is_a_quota_error() -> None:
    with running_server(("--snapshot-bytes-per-key", "16Mi")) as small:
        with SandboxClient(small.base_url, api_key=small.api_key) as client:
            with client.create_sandbox(BUSYBOX) as sb:
                sb.write_file(STATE, b"\x01" * (17 << 20))
                with pytest.raises(QuotaError) as over:
                    sb.snapshot()
                assert (over.value.status, over.value.code) == (429, "quota_exceeded")
            assert client.list_snapshots() == []

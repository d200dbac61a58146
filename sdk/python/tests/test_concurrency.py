"""Many sandboxes at once through one asyncio client."""

from __future__ import annotations

import asyncio
from typing import Any

from orchard_env import AsyncSandboxClient, AsyncSandboxInstance

N = 50


async def test_fifty_sandboxes_at_once(server: Any) -> None:
    async with AsyncSandboxClient() as client:

        async def one(i: int) -> tuple[str, str, str]:
            sb: AsyncSandboxInstance = await client.create_sandbox("busybox:latest")
            job = await sb.exec(f"echo job-{i}")
            run = await sb.run(["echo", f"run-{i}"])
            return sb.id, job.stdout, run.stdout

        results = await asyncio.gather(*(one(i) for i in range(N)))
        ids = [r[0] for r in results]
        assert len(set(ids)) == N
        assert [r[1] for r in results] == [f"job-{i}\n" for i in range(N)]
        assert [r[2] for r in results] == [f"run-{i}\n" for i in range(N)]
        assert set(ids) <= set(server.sandbox_ids())
        assert sorted(await client.cleanup_all()) == sorted(ids)
    assert not set(ids) & set(server.sandbox_ids())


async def test_concurrent_execs_on_one_sandbox(server: Any) -> None:
    async with AsyncSandboxClient() as client:
        async with client.create_sandbox("busybox:latest") as sb:
            # /v1 execs of one sandbox run at the same time: 20 x 0.5 s well under 10 s.
            loop = asyncio.get_running_loop()
            start = loop.time()
            results = await asyncio.gather(*(sb.run(f"sleep 0.5; echo {i}") for i in range(20)))
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
            assert loop.time() - start < 10

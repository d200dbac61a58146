#!/usr/bin/env python3
"""Exec round trip through the SDK next to the same requests with plain httpx.

Usage::

    SANDBOX_BASE_URL=http://127.0.0.1:8000 SANDBOX_API_KEY=... \\
        python sdk/python/bench/bench_sdk.py --out results.md [--image busybox:latest] [-n 300]

One sandbox is created (and deleted at the end). Each row runs ``true`` ``-n`` times
after a warm-up, once through the SDK and once as raw HTTP on a keep-alive
``httpx.Client`` (no SDK), alternating in rounds so that both see the same machine
state; it reports medians, p90s and the SDK/raw ratio of the medians:

- compatible: ``sandbox.exec`` (submit with ``wait=false``, then ``GET /jobs/{id}/wait``)
  against raw ``POST /sandboxes/{id}/exec`` with ``wait=true`` (one request, which the
  SDK does not use because it cannot be retried safely), and against the same two raw
  requests the SDK makes;
- ``/v1`` through the server: ``sandbox.run`` against raw ``POST /v1/sandboxes/{id}/exec``;
- direct: ``sandbox.run`` on a ``direct=True`` sandbox against raw ``POST /v1/exec`` on
  the agent's Unix socket (or URL) with its token.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx

from orchard_env import SandboxClient, __version__

COMMAND = "true"


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def check(response: httpx.Response) -> httpx.Response:
    response.raise_for_status()
    return response


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table here too")
    parser.add_argument("--image", default="busybox:latest")
    parser.add_argument("-n", type=int, default=300, help="round trips per row")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5, help="alternations of SDK and raw")
    args = parser.parse_args()

    base_url = os.environ.get("SANDBOX_BASE_URL")
    if not base_url:
        print("set SANDBOX_BASE_URL (and SANDBOX_API_KEY)", file=sys.stderr)
        return 2
    key = os.environ.get("SANDBOX_API_KEY")
    headers = {"X-API-Key": key} if key else {}

    with (
        SandboxClient() as client,
        httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=60) as raw,
    ):
        sandbox = client.create_sandbox(args.image)
        direct = client.get_sandbox(sandbox.id, direct=True)
        endpoint = direct._endpoint()
        if endpoint.socket and os.path.exists(endpoint.socket):
            agent = httpx.Client(
                base_url="http://agent",
                transport=httpx.HTTPTransport(uds=endpoint.socket),
                headers={"x-orchard-token": endpoint.token},
                timeout=60,
            )
            agent_where = "Unix socket"
        else:
            agent = httpx.Client(
                base_url=endpoint.url or "", headers={"x-orchard-token": endpoint.token}, timeout=60
            )
            agent_where = endpoint.url
        sid = sandbox.id

        def raw_compat_wait() -> None:
            r = check(raw.post(f"/sandboxes/{sid}/exec", json={"command": COMMAND, "wait": True}))
            assert r.json()["status"] == "succeeded"

        def raw_compat_two_step() -> None:
            job = check(raw.post(f"/sandboxes/{sid}/exec", json={"command": COMMAND})).json()
            r = check(raw.get(f"/jobs/{job['job_id']}/wait", params={"timeout": 60}))
            assert r.json()["status"] == "succeeded"

        def raw_v1() -> None:
            r = check(raw.post(f"/v1/sandboxes/{sid}/exec", json={"command": COMMAND}))
            assert r.json()["exit_code"] == 0

        def raw_direct() -> None:
            r = check(agent.post("/v1/exec", json={"command": COMMAND}))
            assert r.json()["exit_code"] == 0

        def sdk_compat() -> None:
            assert sandbox.exec(COMMAND).succeeded

        def sdk_v1() -> None:
            assert sandbox.run(COMMAND).exit_code == 0

        def sdk_direct() -> None:
            assert direct.run(COMMAND).exit_code == 0

        rows = [
            ("compatible `exec` vs raw `wait=true`", sdk_compat, raw_compat_wait),
            ("compatible `exec` vs the same 2 raw requests", sdk_compat, raw_compat_two_step),
            ("`/v1` `run` through the server", sdk_v1, raw_v1),
            (f"direct `run` to the agent ({agent_where})", sdk_direct, raw_direct),
        ]
        results = []
        per_round = max(1, args.n // args.rounds)
        for name, sdk_fn, raw_fn in rows:
            timed(sdk_fn, args.warmup)
            timed(raw_fn, args.warmup)
            sdk_ms: list[float] = []
            raw_ms: list[float] = []
            for _ in range(args.rounds):
                sdk_ms += timed(sdk_fn, per_round)
                raw_ms += timed(raw_fn, per_round)
            results.append((name, sdk_ms, raw_ms))
        agent.close()

    def p90(xs: list[float]) -> float:
        return statistics.quantiles(xs, n=10)[-1]

    lines = [
        "# SDK exec round trip",
        "",
        f"`sdk/python/bench/bench_sdk.py`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"orchard_env {__version__}, Python {platform.python_version()}, httpx "
        f"{httpx.__version__}, image `{args.image}`, command `{COMMAND}`, "
        f"{per_round * args.rounds} round trips per side in {args.rounds} alternating rounds "
        f"after {args.warmup} warm-up, one keep-alive connection pool each.",
        "",
        "| path | SDK median ms | raw httpx median ms | SDK / raw | SDK p90 ms | raw p90 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, sdk_ms, raw_ms in results:
        s, r = statistics.median(sdk_ms), statistics.median(raw_ms)
        lines.append(
            f"| {name} | {s:.3f} | {r:.3f} | {s / r:.2f}x | {p90(sdk_ms):.3f} | {p90(raw_ms):.3f} |"
        )
    lines += [
        "",
        "The compatible `exec` submits the job with `wait=false` and then long-polls "
        "`GET /jobs/{id}/wait`: two requests instead of one, so that a connection lost "
        "during a long command is waited on again instead of running the command twice. "
        "The second row compares it with exactly those two requests made raw.",
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

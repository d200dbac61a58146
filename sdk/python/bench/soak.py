#!/usr/bin/env python3
"""The long soak (``make bench``): rounds of calls with idle gaps past common proxy
timeouts, sync and async, straight to the server and through a proxy that resets
connections idle for 60 s (as load balancers do). Every call must succeed.

Usage::

    SANDBOX_BASE_URL=... SANDBOX_API_KEY=... python sdk/python/bench/soak.py \\
        --out bench/results/soak.md [--rounds 3] [--gap 65] [--proxy-idle 60]

The four runs go at once, so the whole soak takes about ``rounds x gap``. The table
gives, per run, the calls, the errors, the median of the first call after each gap
(a fresh connection) and of the warm calls after it, and their ratio (the warm calls
are the floor), next to the previous run's ratio when the output file has one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from soak import IdleProxy, SoakResult, soak_async, soak_sync  # noqa: E402


def ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000 if xs else float("nan")


def previous_ratios(path: Path) -> dict[str, str]:
    """Run name -> ratio of the table in ``path`` (the previous run), if any."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\| (\S[^|]*?) \|(?:[^|]*\|){4} ([0-9.]+x) \|", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--image", default="busybox:latest")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap", type=float, default=65.0, help="idle seconds before each round")
    parser.add_argument("--proxy-idle", type=float, default=60.0)
    args = parser.parse_args()
    base, key = os.environ["SANDBOX_BASE_URL"], os.environ.get("SANDBOX_API_KEY", "")
    proxy = IdleProxy(base, idle_s=args.proxy_idle, rst=True)
    runs = {
        "sync, direct": ("sync", base),
        "async, direct": ("async", base),
        f"sync, proxy resetting after {args.proxy_idle:g} s idle": ("sync", proxy.url),
        f"async, proxy resetting after {args.proxy_idle:g} s idle": ("async", proxy.url),
    }
    results: dict[str, SoakResult] = {}

    def one(name: str, flavor: str, url: str) -> None:
        try:
            if flavor == "sync":
                results[name] = soak_sync(url, key, args.image, args.rounds, args.gap)
            else:
                results[name] = asyncio.run(soak_async(url, key, args.image, args.rounds, args.gap))
        except Exception as e:  # noqa: BLE001 - reported in the table
            r = SoakResult()
            r.errors.append(f"the run itself failed: {e!r}")
            results[name] = r

    threads = [
        threading.Thread(target=one, args=(name, flavor, url))
        for name, (flavor, url) in runs.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    proxy.close()

    before = previous_ratios(args.out) if args.out else {}
    lines = [
        f"# Soak: idle gaps of {args.gap:g} s between rounds "
        f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"{args.rounds} rounds per run, one sandbox per run ({args.image}); each round: "
        "compatible exec, upload/download/list, health and heartbeat, /v1 run, direct run "
        f"(and a terminal, sync). The proxy closed {proxy.closed_idle} idle connections with "
        "a reset. Floor: the warm calls of the same run.",
        "",
        "| run | calls | errors | first call after a gap, p50 ms | warm calls, p50 ms | ratio "
        "| previous ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    errors = []
    for name in runs:
        r = results[name]
        first, warm = ms(r.first_after_idle), ms(r.warm)
        ratio = f"{first / warm:.2f}x" if warm == warm and warm > 0 else "n/a"
        lines.append(
            f"| {name} | {r.calls} | {len(r.errors)} | {first:.2f} | {warm:.2f} | {ratio} | "
            f"{before.get(name, '-')} |"
        )
        errors += [f"{name}: {e}" for e in r.errors]
    if errors:
        lines += ["", "Errors:", ""] + [f"- {e}" for e in errors]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Generates the sync client from the async one: the async modules are written by hand,
the sync ones are made from them here and committed (as httpcore does with its own
``scripts/unasync``).

    python3 scripts/unasync.py          # rewrites the generated modules
    python3 scripts/unasync.py --check  # fails (with a diff) when they are out of date

Two steps, then formatting:

1. Blocks. Where the two clients differ in more than names (threads or tasks, a
   docstring whose examples differ), the async source says so between directive
   comments; the sync branch is commented out there (``# `` at the directive's
   indentation) and is uncommented here::

       # unasync: async
       await asyncio.gather(*(self._delete_quietly(sid) for sid in ids))
       # unasync: sync
       # for sid in ids:
       #     self._delete_quietly(sid)
       # unasync: end

   Either branch may be empty. The generated file is type-checked and linted like
   any other, so a sync branch cannot rot unseen.
2. Names: the replacement table below, applied with word boundaries. A rule that no
   longer matches anything is an error, so the table stays exact.

The result goes through ``ruff`` (import order, formatting), since lines shortened by
the replacements may then fit on one.
"""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "orchard_env"

#: (hand-written async module, generated sync module), in ``PACKAGE``.
FILES = [("aio.py", "_sync.py"), ("_aio_handles.py", "_sync_handles.py")]

#: (pattern, replacement), applied in order; a pattern matches only at word boundaries
#: (at its start, and at its end unless it ends in a space, as ``await `` does).
SUBS = [
    # Modules and drivers.
    (r"from \.aio import", "from ._sync import"),
    (r"from \._aio_handles import", "from ._sync_handles import"),
    (r"AsyncDriver", "SyncDriver"),
    (r"asynchronous=True", "asynchronous=False"),
    (r"async_body", "sync_body"),
    (r"-> SandboxCreation:", "-> SandboxInstance:"),
    # The async-only end of a body's type: the sync client takes iterables only.
    (r"\s*\|\s*AsyncIterable\[bytes\]", ""),
    # Our classes and httpx's: AsyncSandboxClient -> SandboxClient, httpx.AsyncClient ->
    # httpx.Client, AsyncIterator -> Iterator.
    (r"Async([A-Z][A-Za-z0-9_]*)", r"\1"),
    # The language.
    (r"async def", "def"),
    (r"async with", "with"),
    (r"async for", "for"),
    (r"await ", ""),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"aiter_bytes", "iter_bytes"),
    (r"aclose", "close"),
]

COMPILED = [
    (re.compile(r"(?<!\w)" + pattern + ("" if pattern.endswith(" ") else r"(?!\w)")), repl)
    for pattern, repl in SUBS
]

DIRECTIVE = re.compile(r"^(?P<indent>[ ]*)# unasync: (?P<what>async|sync|end)\s*$")


def header(source: str) -> str:
    return f"# generated from {source} by scripts/unasync.py; do not edit\n"


def resolve_blocks(text: str, name: str) -> str:
    """Keeps the sync branch of every block (uncommented) and drops the async one."""
    out: list[str] = []
    state = None  # None outside a block, else "async" or "sync"
    indent = ""
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        where = f"{name}:{number}"
        found = DIRECTIVE.match(line)
        if found:
            what = found["what"]
            expected = {None: ("async", "sync"), "async": ("sync", "end"), "sync": ("end",)}
            if what not in expected[state]:
                raise SystemExit(f"{where}: '# unasync: {what}' not expected here")
            if state is not None and found["indent"] != indent:
                raise SystemExit(f"{where}: directive indented unlike its block's start")
            indent = found["indent"]
            state = None if what == "end" else what
            continue
        if state == "async":
            continue
        if state == "sync":
            body = line.rstrip("\n")
            if body == indent + "#":
                out.append("\n")
            elif body.startswith(indent + "# "):
                out.append(indent + body[len(indent) + 2 :] + "\n")
            else:
                raise SystemExit(f"{where}: a sync line must be commented out with '# '")
            continue
        out.append(line)
    if state is not None:
        raise SystemExit(f"{name}: block not ended with '# unasync: end'")
    return "".join(out)


def substitute(text: str, used: set[int]) -> str:
    for index, (pattern, repl) in enumerate(COMPILED):
        text, count = pattern.subn(repl, text)
        if count:
            used.add(index)
    return text


def ruff(*args: str, source: str, filename: Path) -> str:
    exe = shutil.which("ruff")
    command = [exe] if exe else [sys.executable, "-m", "ruff"]
    done = subprocess.run(
        [*command, *args, "--stdin-filename", str(filename), "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(args)} failed on {filename}:\n{done.stderr}")
    return done.stdout


def generate(source: str, target: str, used: set[int]) -> str:
    text = (PACKAGE / source).read_text()
    text = header(source) + substitute(resolve_blocks(text, source), used)
    path = PACKAGE / target
    text = ruff("check", "--fix-only", "--select", "I", source=text, filename=path)
    return ruff("format", source=text, filename=path)


def main() -> int:
    check = "--check" in sys.argv[1:]
    used: set[int] = set()
    stale = []
    for source, target in FILES:
        generated = generate(source, target, used)
        path = PACKAGE / target
        current = path.read_text() if path.exists() else ""
        if generated == current:
            continue
        if check:
            stale.append(target)
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                generated.splitlines(keepends=True),
                f"{target} (committed)",
                f"{target} (generated from {source})",
            )
            sys.stdout.writelines(diff)
        else:
            path.write_text(generated)
            print(f"wrote {path.relative_to(ROOT)}")
    unused = [SUBS[i] for i in range(len(SUBS)) if i not in used]
    if unused:
        print(f"replacements that matched nothing (remove them): {unused}", file=sys.stderr)
        return 1
    if stale:
        print(
            f"out of date: {', '.join(stale)}; run python3 scripts/unasync.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

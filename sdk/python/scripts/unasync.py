#!/usr/bin/env python3
"""Generates the sync client from the async one: the async modules are written by hand,
the sync ones are made from them here and committed (as httpcore does with its own
``scripts/unasync``).

    python3 scripts/unasync.py          # rewrites the generated modules
    python3 scripts/unasync.py --check  # fails (with a diff) when they are out of date

Each async module has a generated twin: ``aio.py`` gives ``_sync.py`` and ``_aio_X.py``
gives ``_sync_X.py``, except ``_aio_only.py``, whose twin ``_sync_only.py`` is written
by hand: the few pieces the two clients do their own way (a task or a thread, an
iterator object or a generator) live there, under the same names, and the generated
modules import them. A twin is made in three steps, then formatted:

1. Docstrings. The sync client's docstrings are the reference (with the examples the
   doc tests run); the async ones are short and point to them. Where a sync docstring
   is not the async one with its names changed, ``scripts/sync_docs.py`` holds it, and
   it replaces the async docstring of the same place (by qualified sync name, such as
   ``SandboxClient.create_sandbox``; module docstrings by module name).
2. Async-only definitions. The names in ``ASYNC_ONLY`` (a class, a method) are left
   out, with the comment lines just above them, and so are imports of them.
3. Names: the replacement table ``SUBS``, applied with word boundaries.

Every docstring, every ``ASYNC_ONLY`` name and every replacement must be used, so the
tables stay exact. The result goes through ``ruff`` (unused imports, which only the async
side needed, removed; ``yield from`` for loops that only yield; import order;
formatting), and is type-checked and linted like any other module.
"""

from __future__ import annotations

import ast
import difflib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "orchard_env"

#: Async modules whose sync twin is written by hand, not generated.
HAND_WRITTEN_TWINS = {"_aio_only.py"}

#: The first line of every generated module.
HEADER = "# generated from {source} by scripts/unasync.py; do not edit\n"

#: Definitions (async qualified names) that the sync client does not have, and why.
ASYNC_ONLY = {
    # What AsyncSandboxClient.create_sandbox returns (an awaitable that is also an
    # async context manager); SandboxClient.create_sandbox returns the sandbox itself.
    "SandboxCreation": "_aio_client.py",
    # Deletes an async sandbox from sync code; a sync sandbox's delete is that already.
    "AsyncSandboxInstance.delete_sync": "_aio_sandbox.py",
}

#: (pattern, replacement), applied in order; a pattern matches only at word boundaries
#: (at its start, and at its end unless it ends in a space, as ``await `` does).
SUBS = [
    # Modules and drivers.
    (r"from \._aio_(\w+) import", r"from ._sync_\1 import"),
    (r"AsyncDriver", "SyncDriver"),
    (r"asynchronous=True", "asynchronous=False"),
    (r"async_body", "sync_body"),
    # create_sandbox: the sync client returns the sandbox itself (see ASYNC_ONLY).
    (r"-> SandboxCreation:", "-> SandboxInstance:"),
    (r"SandboxCreation\((\w+)\)", r"\1"),
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


def twin(source: str) -> str:
    """The generated module of an async one: ``aio.py`` -> ``_sync.py``,
    ``_aio_files.py`` -> ``_sync_files.py``."""
    return "_sync.py" if source == "aio.py" else "_sync_" + source.removeprefix("_aio_")


def sources() -> list[str]:
    """The async modules that have a generated twin."""
    found = sorted(p.name for p in PACKAGE.glob("_aio_*.py") if p.name not in HAND_WRITTEN_TWINS)
    return ["aio.py", *found]


def sync_name(qualname: str) -> str:
    """``AsyncSandboxClient.create_sandbox`` -> ``SandboxClient.create_sandbox``."""
    return ".".join(part.removeprefix("Async") for part in qualname.split("."))


@dataclass
class Docs:
    """The sync docstrings of ``scripts/sync_docs.py``: literal source text, by place."""

    modules: dict[str, str]
    defs: dict[str, tuple[str, int]]  # qualified name -> (literal, its column)

    @classmethod
    def load(cls) -> Docs:
        path = ROOT / "scripts" / "sync_docs.py"
        text = path.read_text()
        tree = ast.parse(text)
        modules: dict[str, str] = {}
        defs: dict[str, tuple[str, int]] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                for key, value in zip(node.value.keys, node.value.values, strict=True):
                    assert isinstance(key, ast.Constant) and isinstance(value, ast.Constant)
                    modules[str(key.value)] = segment(text, value)
        for qualname, node in definitions(tree):
            doc = docstring(node)
            if doc is not None:
                defs[qualname] = (segment(text, doc), doc.col_offset)
            elif not isinstance(node, ast.ClassDef):  # a class may only hold methods
                raise SystemExit(f"{path.name}: {qualname} has no docstring")
        return cls(modules, defs)


def segment(text: str, node: ast.AST) -> str:
    found = ast.get_source_segment(text, node)
    assert found is not None
    return found


Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def definitions(tree: ast.Module | ast.ClassDef, prefix: str = "") -> list[tuple[str, Definition]]:
    """Every class and function of a module, nested in classes, by qualified name."""
    out: list[tuple[str, Definition]] = []
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            qualname = prefix + node.name
            out.append((qualname, node))
            if isinstance(node, ast.ClassDef):
                out.extend(definitions(node, qualname + "."))
    return out


def docstring(node: ast.Module | Definition) -> ast.Expr | None:
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            return first
    return None


class Edits:
    """Replacements of line and column ranges of one text, applied last to first."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        self.edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []

    def replace(self, node: ast.stmt, new: str) -> None:
        assert node.end_lineno is not None and node.end_col_offset is not None
        self.edits.append(
            ((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), new)
        )

    def drop_lines(self, first: int, last: int) -> None:
        self.edits.append(((first, 0), (last + 1, 0), ""))

    def apply(self) -> str:
        lines = self.lines + [""]
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line))
        text = "".join(lines)
        spans = sorted(
            ((offsets[s[0] - 1] + s[1], offsets[e[0] - 1] + e[1], new) for s, e, new in self.edits),
            reverse=True,
        )
        after = [(len(text) + 1, 0, ""), *spans]
        for (start, end, new), (next_start, _, _) in zip(spans, after, strict=False):
            if end > next_start:
                raise SystemExit("overlapping edits")
            text = text[:start] + new + text[end:]
        return text


def reindent(literal: str, from_col: int, to_col: int) -> str:
    """A docstring's source moved from column ``from_col`` to ``to_col``."""
    if from_col == to_col:
        return literal
    first, *rest = literal.split("\n")
    moved = []
    for line in rest:
        if line.strip():
            line = " " * to_col + line[from_col:] if line[:from_col].isspace() else line
        moved.append(line)
    return "\n".join([first, *moved])


def rewrite(source: str, text: str, docs: Docs, used: set[str]) -> str:
    """Steps 1 and 2: the sync docstrings, and no async-only definitions or imports.
    Adds to ``used`` the docstring places and ``ASYNC_ONLY`` names it found."""
    tree = ast.parse(text)
    edits = Edits(text)
    lines = text.splitlines()
    module_name = twin(source).removesuffix(".py")
    if module_name in docs.modules:
        doc = docstring(tree)
        if doc is None:
            raise SystemExit(f"{source}: no module docstring to replace")
        edits.replace(doc, docs.modules[module_name])
        used.add(module_name)
    dropped = {name for name in ASYNC_ONLY if "." not in name}
    for qualname, node in definitions(tree):
        if any(qualname.startswith(name + ".") for name in ASYNC_ONLY):
            continue  # inside a definition left out
        if qualname in ASYNC_ONLY:
            if ASYNC_ONLY[qualname] != source:
                raise SystemExit(f"{source}: {qualname} is listed in ASYNC_ONLY for another file")
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            while first > 1 and lines[first - 2].strip().startswith("#"):
                first -= 1
            edits.drop_lines(first, node.end_lineno or node.lineno)
            used.add(qualname)
            continue
        name = sync_name(qualname)
        doc = docstring(node)
        if name in docs.defs and doc is not None:  # (an @overload stub has none)
            literal, column = docs.defs[name]
            edits.replace(doc, reindent(literal, column, doc.col_offset))
            used.add(name)
    for imp in ast.walk(tree):
        if isinstance(imp, ast.ImportFrom) and any(a.name in dropped for a in imp.names):
            kept = [a for a in imp.names if a.name not in dropped]
            used.update(a.name for a in imp.names if a.name in dropped)
            if kept:
                edits.replace(imp, ast.unparse(ast.ImportFrom(imp.module, kept, imp.level)))
            else:
                edits.drop_lines(imp.lineno, imp.end_lineno or imp.lineno)
    return edits.apply()


def substitute(text: str, used: set[int]) -> str:
    """Step 3: the replacement table."""
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


def generate(source: str, docs: Docs, used_docs: set[str], used_subs: set[int]) -> str:
    text = (PACKAGE / source).read_text()
    if "# unasync:" in text:
        raise SystemExit(f"{source}: '# unasync:' blocks are gone; see scripts/unasync.py")
    text = HEADER.format(source=source) + rewrite(source, text, docs, used_docs)
    text = substitute(text, used_subs)
    path = PACKAGE / twin(source)
    # F401: imports only the async side used; UP028: `yield from` where a sync loop
    # only yields; I: import order.
    fixes = ("--fix-only", "--unsafe-fixes", "--select", "F401,UP028,I")
    text = ruff("check", *fixes, source=text, filename=path)
    return ruff("format", source=text, filename=path)


def orphans(expected: set[str]) -> list[Path]:
    """Generated modules whose async source is gone."""
    return [
        path
        for path in sorted(PACKAGE.glob("_sync*.py"))
        if path.name not in expected and path.read_text().startswith("# generated from ")
    ]


def main() -> int:
    check = "--check" in sys.argv[1:]
    docs = Docs.load()
    used_docs: set[str] = set()
    used_subs: set[int] = set()
    stale = []
    pairs = [(source, twin(source)) for source in sources()]
    for source, target in pairs:
        generated = generate(source, docs, used_docs, used_subs)
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
    for path in orphans({target for _, target in pairs}):
        if check:
            stale.append(path.name)
            print(f"{path.name}: generated from a module that is gone")
        else:
            path.unlink()
            print(f"removed {path.relative_to(ROOT)}")
    problems = []
    unused_subs = [SUBS[i] for i in range(len(SUBS)) if i not in used_subs]
    if unused_subs:
        problems.append(f"replacements that matched nothing (remove them): {unused_subs}")
    unused_docs = sorted((set(docs.modules) | set(docs.defs)) - used_docs)
    if unused_docs:
        problems.append(f"sync_docs.py entries with no place (remove them): {unused_docs}")
    unused_only = sorted(set(ASYNC_ONLY) - used_docs)
    if unused_only:
        problems.append(f"ASYNC_ONLY names not found (remove them): {unused_only}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if stale:
        print(
            f"out of date: {', '.join(stale)}; run python3 scripts/unasync.py",
            file=sys.stderr,
        )
    return 1 if problems or stale else 0


if __name__ == "__main__":
    sys.exit(main())

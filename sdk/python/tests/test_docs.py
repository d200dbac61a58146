"""The examples of the docs run: every docstring example, and every Python block of
the README, against the session's server."""

from __future__ import annotations

import asyncio
import doctest
import importlib
import pkgutil
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import orchard_env
from orchard_env import AsyncSandboxClient, SandboxClient

README = Path(__file__).resolve().parents[1] / "README.md"
#: Every module of the package: the generated sync ones hold the reference examples.
MODULES = [orchard_env] + [
    importlib.import_module(m.name)
    for m in pkgutil.walk_packages(orchard_env.__path__, "orchard_env.")
]


def run_async(main: Callable[[Any], Awaitable[Any]], image: str = "busybox:latest") -> Any:
    """Runs ``main(sandbox)`` with a fresh async client and sandbox (for async examples)."""

    async def go() -> Any:
        async with AsyncSandboxClient() as c:
            async with c.create_sandbox(image) as sandbox:
                return await main(sandbox)

    return asyncio.run(go())


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module: Any, server: Any) -> None:
    with SandboxClient() as c, c.create_sandbox("busybox:latest") as sandbox:
        globs = {
            **{name: getattr(orchard_env, name) for name in orchard_env.__all__},
            "client": c,
            "sandbox": sandbox,
            "run_async": run_async,
            "asyncio": asyncio,
        }
        finder = doctest.DocTestFinder()
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        tests = finder.find(module, module.__name__, extraglobs=globs)
        assert module is not orchard_env or tests
        for test in tests:
            runner.run(test)
        assert runner.failures == 0, f"{runner.failures} example(s) failed in {module.__name__}"


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples() -> None:
    assert len(readme_blocks()) >= 8


@pytest.mark.parametrize("index", range(len(readme_blocks())))
def test_readme_example(index: int, python_image: str) -> None:
    code = readme_blocks()[index]
    exec(compile(code, f"README.md block {index}", "exec"), {"__name__": f"readme_{index}"})

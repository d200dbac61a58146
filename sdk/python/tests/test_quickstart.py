"""The quick start of the README, verbatim, on python:3.11-slim."""

from __future__ import annotations

from typing import Any

import pytest

from orchard_env import SandboxClient


def test_quickstart(python_image: str, capsys: pytest.CaptureFixture[str]) -> None:
    with SandboxClient() as client:
        with client.create_sandbox("python:3.11-slim") as sandbox:
            print(sandbox.exec("echo 'Hello, Orchard!'").stdout)
    assert capsys.readouterr().out == "Hello, Orchard!\n\n"


def test_python_image_runs_python(python_image: str, server: Any) -> None:
    with SandboxClient() as client:
        with client.create_sandbox(python_image) as sandbox:
            assert sandbox.run(["python3", "-c", "print(2 + 2)"]).stdout == "4\n"

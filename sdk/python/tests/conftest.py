"""A real ``orchard serve`` on the local backend for the whole test session.

The binary is ``$ORCHARD_BIN`` (default: the workspace's ``target/debug/orchard``), the
agent ``$ORCHARD_AGENT_BIN`` (default: the musl release build);
``$ORCHARD_TEST_SERVE_ARGS`` adds arguments (``tests/k8s/backend.sh`` runs tests on the
Kubernetes backend with it). The server gets a fresh data directory and API key, the
test images are imported into it with ``POST /v1/images/import`` (busybox for
everything, python:3.11-slim only for the tests that need it), and
``SANDBOX_BASE_URL``/``SANDBOX_API_KEY`` point at it. SIGTERM at the end makes it delete
its sandboxes; before that the session checks that none was left.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard_env import AsyncSandboxClient, SandboxClient

REPO = Path(__file__).resolve().parents[3]
ORCHARD_BIN = os.environ.get("ORCHARD_BIN", str(REPO / "target/debug/orchard"))
AGENT_BIN = os.environ.get(
    "ORCHARD_AGENT_BIN", str(REPO / "target/x86_64-unknown-linux-musl/release/orchard-agent")
)
IMAGES = Path(os.environ.get("ORCHARD_TEST_IMAGES", str(REPO / "images/out")))

BUSYBOX = "busybox:latest"
PYTHON = "python:3.11-slim"
SWE = "swe:latest"

#: How long the server may take to start listening (it is a local process).
START_DEADLINE_S = 60.0


@dataclass
class Server:
    """The running server of the session."""

    base_url: str
    api_key: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path

    def http(self) -> httpx.Client:
        """A raw HTTP client with the key (for checks that must not go through the SDK)."""
        return httpx.Client(
            base_url=self.base_url, headers={"X-API-Key": self.api_key}, timeout=600
        )

    def sandbox_ids(self) -> list[str]:
        """Ids of the sandboxes the server holds for our key."""
        with self.http() as http:
            response = http.get("/v1/sandboxes")
            response.raise_for_status()
            return [s["id"] for s in response.json()["sandboxes"]]

    def log_tail(self, n: int = 40) -> str:
        """The end of the server's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def import_image(server: Server, layout: Path, name: str) -> None:
    """Tars an OCI layout directory into a temp file and streams it to the import route."""
    if not (layout / "index.json").exists():
        pytest.fail(f"test image {layout} missing: run `make images` first")
    with tempfile.TemporaryFile() as tmp:
        with tarfile.open(fileobj=tmp, mode="w") as tf:
            for entry in sorted(layout.iterdir()):
                tf.add(entry, arcname=entry.name)
        tmp.seek(0)

        def chunks() -> Iterator[bytes]:
            while chunk := tmp.read(1 << 20):
                yield chunk

        with server.http() as http:
            response = http.post(
                "/v1/images/import",
                params={"name": name},
                content=chunks(),
                headers={"Content-Type": "application/x-tar"},
            )
    assert response.status_code == 200, response.text


def _wait_ready_file(proc: subprocess.Popen[bytes], ready: Path, log: Path) -> str:
    # Waiting for another process to start listening: poll its ready file with a deadline.
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"orchard serve exited with {proc.returncode}:\n{log.read_text()}")
        text = ready.read_text() if ready.exists() else ""
        if text.endswith("\n"):
            return text.strip()
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"orchard serve did not write {ready} in {START_DEADLINE_S}s")


@contextlib.contextmanager
def running_server(
    extra_args: tuple[str, ...] = (),
    data_dir: Path | None = None,
    api_key: str | None = None,
    import_busybox: bool = True,
) -> Iterator[Server]:
    """``orchard serve`` with a fresh data dir and key, busybox imported; stopped at exit.

    ``extra_args``, a shared ``data_dir`` and ``api_key`` make it one of several
    replicas (``test_replicas.py``); a replica after the first needs no import.
    """
    if not os.access(ORCHARD_BIN, os.X_OK):
        pytest.fail(f"no orchard binary at {ORCHARD_BIN} (set ORCHARD_BIN or build it)")
    if not os.access(AGENT_BIN, os.X_OK):
        pytest.fail(f"no agent binary at {AGENT_BIN} (run `make agent`)")
    work = Path(tempfile.mkdtemp(prefix="orchard-sdk-test-"))
    data_dir = data_dir or work / "data"
    ready, log_path = work / "ready", work / "server.log"
    api_key = api_key or "test-" + secrets.token_hex(8)
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [
            ORCHARD_BIN,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(data_dir),
            "--api-key",
            api_key,
            "--agent",
            AGENT_BIN,
            "--ready-file",
            str(ready),
            "--log-level",
            "warn",
            # Another backend for the same tests (tests/k8s/backend.sh: Kubernetes).
            *shlex.split(os.environ.get("ORCHARD_TEST_SERVE_ARGS", "")),
            *extra_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    srv = Server("", api_key, data_dir, proc, log_path)
    try:
        srv.base_url = _wait_ready_file(proc, ready, log_path)
        if import_busybox:
            import_image(srv, IMAGES / "busybox", BUSYBOX)
        yield srv
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The session's server; ``SANDBOX_BASE_URL``/``SANDBOX_API_KEY`` point at it."""
    saved = {
        k: os.environ.get(k) for k in ("SANDBOX_BASE_URL", "SANDBOX_API_KEY", "SANDBOX_PREFIX")
    }
    try:
        with running_server() as srv:
            os.environ["SANDBOX_BASE_URL"] = srv.base_url
            os.environ["SANDBOX_API_KEY"] = srv.api_key
            os.environ["SANDBOX_PREFIX"] = "sdktest"
            yield srv
            left = srv.sandbox_ids()
            assert left == [], f"sandboxes left behind by the tests: {left}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def python_image(server: Server) -> str:
    """python:3.11-slim imported into the server (only for tests where the image matters)."""
    import_image(server, IMAGES / "python", PYTHON)
    return PYTHON


@pytest.fixture(scope="session")
def swe_image(server: Server) -> str:
    """swe:latest (a conda env activated only by ~/.bashrc) imported into the server."""
    import_image(server, IMAGES / "swe", SWE)
    return SWE


@pytest.fixture
def client(server: Server) -> Iterator[SandboxClient]:
    """A sync client of the session's server."""
    with SandboxClient() as c:
        yield c


@pytest.fixture
def sandbox(client: SandboxClient) -> Iterator[Any]:
    """A busybox sandbox (sync)."""
    with client.create_sandbox(BUSYBOX) as sb:
        yield sb


@pytest.fixture(params=["sync", "async"])
async def box(request: pytest.FixtureRequest, server: Server) -> AsyncIterator[Any]:
    """A busybox sandbox, once from the sync client and once from the async one.

    Test bodies are written once: ``await aw(box.method(...))`` (see ``helpers``) works
    for both.
    """
    if request.param == "sync":
        with SandboxClient() as c:
            with c.create_sandbox(BUSYBOX) as sb:
                yield sb
    else:
        async with AsyncSandboxClient() as ac:
            async with ac.create_sandbox(BUSYBOX) as asb:
                yield asb


@pytest.fixture(params=["sync", "async"])
async def any_client(request: pytest.FixtureRequest, server: Server) -> AsyncIterator[Any]:
    """A client, once sync and once async."""
    if request.param == "sync":
        with SandboxClient() as c:
            yield c
    else:
        async with AsyncSandboxClient() as ac:
            yield ac

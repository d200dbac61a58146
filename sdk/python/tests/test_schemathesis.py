"""Schemathesis against both OpenAPI documents, on a real server with real sandboxes.

A server of its own (``running_server``: what the generated requests do to sandboxes and
images stays out of the other tests' way) with busybox sandboxes: ``st-main`` for most
routes, ``st-scratch`` for the paths with a route that writes, moves or deletes arbitrary
files (so that a generated ``rm -r /`` cannot take away what later requests run), and
``st-victim``/``st-victim-compat`` for the paths whose ``DELETE`` removes the sandbox
(schemathesis reuses ids it read in earlier answers, so a generated id would not keep the
others safe), ``st-paused`` for pause and resume (a paused sandbox answers 409 to every
route of its agent); ``DELETE /v1/images`` may remove only ``st-victim:latest``. The ids are
written into the paths. Then ``st run`` (the schemathesis CLI; phases examples, coverage
and fuzzing, positive and negative data) on

- ``orchestrator/openapi.json``: every route of the server;
- ``protocol/openapi/agent.json``: every agent route, reached through the server's proxy
  (``/v1/exec`` is ``/v1/sandboxes/st-main/exec``), behind the server's API key, with the
  errors the server answers itself (``Detail``) allowed next to the agent's. The agent
  itself is never run outside a sandbox: the requests write and delete arbitrary paths.

Left out: ``POST /v1/images/pull`` (it fetches from registries on the network; its
refusals are tested in the orchestrator's image tests) and the agent's ``/livez`` and
``/v1/pty/compat`` (not routes of the proxy; the compatible PTY is
``/sandboxes/{id}/exec/pty`` of the orchestrator document).

Every check runs but those in ``EXCLUDED_CHECKS`` (with the reason); no response may be
a server error (5xx) but those in ``DESIGNED_5XX`` (with the reason). Examples per
operation: ``ORCHARD_SCHEMATHESIS_EXAMPLES`` (default 20); seed:
``ORCHARD_SCHEMATHESIS_SEED`` (default random, printed).
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import BUSYBOX, IMAGES, REPO, Server, import_image, running_server

ORCHESTRATOR_DOC = REPO / "orchestrator/openapi.json"
AGENT_DOC = REPO / "protocol/openapi/agent.json"
MAIN, SCRATCH = "st-main", "st-scratch"
EXAMPLES = int(os.environ.get("ORCHARD_SCHEMATHESIS_EXAMPLES", "20"))

#: Routes (method, path in the document) whose requests write, move or delete paths:
#: every route of their path goes to ``st-scratch``.
DESTRUCTIVE = {
    ("put", "/v1/sandboxes/{id}/files"),
    ("delete", "/v1/sandboxes/{id}/files"),
    ("put", "/v1/sandboxes/{id}/files/archive"),
    ("post", "/v1/sandboxes/{id}/files/move"),
    ("post", "/v1/sandboxes/{id}/git/reset"),
    ("post", "/sandboxes/{id}/files"),
    ("post", "/sandboxes/{id}/apply_patch"),
    ("put", "/v1/files"),
    ("delete", "/v1/files"),
    ("put", "/v1/files/archive"),
    ("post", "/v1/files/move"),
    ("post", "/v1/git/reset"),
}
#: Paths whose sandbox is deleted by one of their routes, and the sandbox each gets.
#: Schemathesis reuses ids it read in earlier answers, so a generated id is no
#: protection: the delete routes get sandboxes of their own to delete.
VICTIMS = {"/v1/sandboxes/{id}": "st-victim", "/sandboxes/{id}": "st-victim-compat"}
#: Paths that change the state every other route of their sandbox sees (paused: 409 to
#: all of them), and the sandbox they get.
PAUSED = {"/v1/sandboxes/{id}/pause": "st-paused", "/v1/sandboxes/{id}/resume": "st-paused"}
#: The image ``DELETE /v1/images`` may remove (its ``reference`` is pinned to it).
VICTIM_IMAGE = "st-victim:latest"
#: Routes left out (see the module docs).
SKIPPED = {("post", "/v1/images/pull"), ("get", "/livez"), ("get", "/v1/pty/compat")}

#: Checks that do not hold for this API, and why.
EXCLUDED_CHECKS = {
    "positive_data_acceptance": "the documents do not state every rule a valid request"
    " follows (absolute paths, non-empty names, non-negative times, a base64 body), so"
    " schema-valid requests may rightly be 400 or 422",
}

#: Server errors that are answers by design: (method, path in the document) -> statuses.
DESIGNED_5XX = {
    # `processes: true` asks for process checkpoints, which no server here can take (no
    # working CRIU): 501 not_implemented (tests/test_snapshots.py checks the answer).
    ("POST", "/v1/sandboxes/{id}/snapshots"): ["501"],
}

METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def _sandbox_for(path: str, target: str, methods: list[str]) -> str | None:
    if target in VICTIMS:
        return VICTIMS[target]
    if target in PAUSED:
        return PAUSED[target]
    if not target.startswith(("/v1/sandboxes/{id}/", "/sandboxes/{id}/")):
        return None
    return SCRATCH if any((m, path) in DESTRUCTIVE for m in methods) else MAIN


def pinned(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``doc`` with the sandbox routes' ``{id}`` replaced by a test sandbox's id.

    With ``prefix`` (the agent document), every path is first moved under it: ``/v1/exec``
    becomes ``/v1/sandboxes/{id}/exec``.
    """
    out = copy.deepcopy(doc)
    paths: dict[str, Any] = {}
    for path, item in doc["paths"].items():
        item = {k: copy.deepcopy(v) for k, v in item.items() if (k, path) not in SKIPPED}
        methods = [m for m in item if m in METHODS]
        if not methods:
            continue
        target = prefix + path.removeprefix("/v1") if prefix else path
        sandbox = _sandbox_for(path, target, methods)
        if sandbox is not None:
            target = target.replace("{id}", sandbox, 1)
        if "{id}" not in target:
            for holder in [item, *(item[m] for m in methods)]:
                holder["parameters"] = [
                    p
                    for p in holder.get("parameters", [])
                    if not (p.get("in") == "path" and p["name"] == "id")
                ]
        if path == "/v1/images" and "delete" in item:
            for p in item["delete"].get("parameters", []):
                if p["name"] == "reference":
                    p["schema"] = {"type": "string", "enum": [VICTIM_IMAGE]}
        paths[target] = item
    out["paths"] = paths
    return out


def agent_through_proxy(doc: dict[str, Any], orchestrator: dict[str, Any]) -> dict[str, Any]:
    """The agent document as the server's proxy serves it: paths under a sandbox, the
    server's API key instead of the sandbox token, and errors the server answers itself
    (``Detail``) next to the agent's (``ErrorBody``)."""
    out = pinned(doc, prefix="/v1/sandboxes/{id}")
    out["components"]["securitySchemes"] = orchestrator["components"]["securitySchemes"]
    out["security"] = orchestrator["security"]
    out["components"]["schemas"]["Detail"] = orchestrator["components"]["schemas"]["Detail"]
    either = {
        "anyOf": [
            {"$ref": "#/components/schemas/ErrorBody"},
            {"$ref": "#/components/schemas/Detail"},
        ]
    }
    for item in out["paths"].values():
        for method, op in item.items():
            if method in METHODS:
                op["responses"]["default"]["content"]["application/json"]["schema"] = either
    return out


def create_sandbox(http: httpx.Client, sandbox_id: str) -> None:
    response = http.post("/v1/sandboxes", json={"image": BUSYBOX, "id": sandbox_id})
    assert response.status_code == 201, response.text
    assert response.json()["ready"], response.text


@pytest.fixture(scope="module")
def st_server() -> Iterator[Server]:
    with running_server() as srv:
        import_image(srv, IMAGES / "busybox", VICTIM_IMAGE)
        with srv.http() as http:
            for sandbox_id in (MAIN, SCRATCH, *VICTIMS.values(), *set(PAUSED.values())):
                create_sandbox(http, sandbox_id)
        yield srv
        # Whatever the generated requests created goes too (the server deletes its
        # sandboxes when stopped; this checks that deleting them works).
        for sandbox_id in srv.sandbox_ids():
            with srv.http() as http:
                response = http.delete(f"/v1/sandboxes/{sandbox_id}")
                assert response.status_code == 200, response.text


def config(doc: dict[str, Any]) -> str:
    """``schemathesis.toml``: the ``DESIGNED_5XX`` statuses of the operations ``doc`` (a
    pinned document) has are not server errors."""
    lines = []
    for (method, path), statuses in DESIGNED_5XX.items():
        [target] = pinned({"paths": {path: {method.lower(): {}}}})["paths"]
        if target in doc["paths"]:
            lines += [
                "[[operations]]",
                f"include-name = {json.dumps(f'{method} {target}')}",
                "checks.not_a_server_error.expected-statuses = "
                + json.dumps(["2xx", "3xx", "4xx", *statuses]),
                "",
            ]
    return "\n".join(lines)


def run_schemathesis(server: Server, doc: dict[str, Any], name: str) -> None:
    seed = int(os.environ.get("ORCHARD_SCHEMATHESIS_SEED", random.randrange(1 << 32)))
    with tempfile.TemporaryDirectory(prefix="orchard-st-") as work:
        schema = Path(work) / f"{name}.json"
        schema.write_text(json.dumps(doc))
        settings = Path(work) / "schemathesis.toml"
        settings.write_text(config(doc))
        command = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(settings),
            "run",
            str(schema),
            "--url",
            server.base_url,
            "--header",
            f"X-API-Key: {server.api_key}",
            "--checks",
            "all",
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            str(seed),
            # One worker: Hypothesis's lambda descriptions are not thread-safe on Python
            # 3.11 ("AST constructor recursion depth mismatch").
            "--workers",
            "1",
            "--phases",
            "examples,coverage,fuzzing",
            "--request-timeout",
            "60",
            "--suppress-health-check",
            "all",
            "--no-shrink",
        ]
        if EXCLUDED_CHECKS:
            command += ["--exclude-checks", ",".join(EXCLUDED_CHECKS)]
        started = time.monotonic()
        result = subprocess.run(
            command,
            cwd=work,
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "NO_COLOR": "1",
                "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
                "PYTHONPATH": str(Path(__file__).parent),
            },
            timeout=900,
        )
        took = time.monotonic() - started
    output = result.stdout + result.stderr
    summary = [line for line in output.splitlines() if line.strip()][-3:]
    print(f"schemathesis {name}: seed {seed}, {took:.0f} s: {' / '.join(summary)}")
    assert result.returncode == 0, (
        f"schemathesis found problems in {name} (seed {seed}):\n{output}\n"
        f"server log:\n{server.log_tail(80)}"
    )


@pytest.mark.timeout(900)
def test_orchestrator_document_has_no_server_errors(st_server: Server) -> None:
    doc = json.loads(ORCHESTRATOR_DOC.read_text())
    run_schemathesis(st_server, pinned(doc), "orchestrator")


@pytest.mark.timeout(900)
def test_agent_document_through_the_proxy_has_no_server_errors(st_server: Server) -> None:
    orchestrator = json.loads(ORCHESTRATOR_DOC.read_text())
    doc = agent_through_proxy(json.loads(AGENT_DOC.read_text()), orchestrator)
    run_schemathesis(st_server, doc, "agent")

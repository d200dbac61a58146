"""The SDK's error classes against the orchestrator's error codes, without a server.

The codes and their statuses are read from their definition, ``ServiceErrorCode`` in
``protocol/src/error.rs``: the arms of its ``http_status`` and ``as_str`` matches. The
committed OpenAPI document (``orchestrator/openapi.json``), which is generated from that
enum, must not contradict it (it may lag behind until ``make openapi`` is run; a Rust
test fails then). A code added on one side only fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import orchard_env
from orchard_env import errors

REPO = Path(__file__).resolve().parents[3]
SOURCE = REPO / "protocol" / "src" / "error.rs"
DOCUMENT = REPO / "orchestrator" / "openapi.json"


def _match_arms(source: str, function: str, value: str) -> dict[str, str]:
    """``Variant => value`` arms of ``ServiceErrorCode::function``'s match."""
    impl = source[source.index("impl ServiceErrorCode {") :]
    body = impl[impl.index(f"pub fn {function}(") :]
    body = body[: body.index("\n    }\n")]
    return dict(re.findall(rf"^\s+(\w+) => ({value}),$", body, flags=re.M))


def service_codes() -> dict[str, int]:
    """Each of the orchestrator's codes with its HTTP status, from the Rust enum."""
    source = SOURCE.read_text()
    statuses = _match_arms(source, "http_status", r"\d{3}")
    names = _match_arms(source, "as_str", r'"[a-z_]+"')
    assert statuses and set(statuses) == set(names), (statuses, names)
    return {names[v].strip('"'): int(statuses[v]) for v in names}


def document_codes() -> dict[str, int]:
    """The codes and statuses the committed OpenAPI document lists."""
    schema = json.loads(DOCUMENT.read_text())["components"]["schemas"]["ServiceErrorCode"]
    codes = {}
    for variant in schema["oneOf"]:
        status = re.match(r"HTTP (\d{3}): ", variant["description"])
        assert status, f"no status opens {variant}"
        for name in variant["enum"]:
            codes[name] = int(status.group(1))
    return codes


CODES = service_codes()


def test_the_source_lists_the_codes() -> None:
    assert {"not_found", "quota_exceeded", "sandbox_failed", "not_implemented"} <= set(CODES)
    assert (CODES["not_found"], CODES["not_implemented"]) == (404, 501)


def test_the_document_does_not_contradict_the_source() -> None:
    documented = document_codes()
    assert {"not_found", "quota_exceeded", "sandbox_failed"} <= set(documented)
    for code, status in documented.items():
        assert CODES.get(code) == status, code


def test_every_code_has_its_own_class_and_every_class_a_code() -> None:
    assert set(errors._BY_CODE) == set(CODES)
    classes = list(errors._BY_CODE.values())
    assert len(set(classes)) == len(classes), "two codes share a class"
    for cls in classes:
        assert cls.__name__ in orchard_env.__all__, cls
        assert cls.__name__ in errors.__all__, cls


@pytest.mark.parametrize("code", sorted(CODES))
def test_an_answer_with_a_code_raises_its_class(code: str) -> None:
    status = CODES[code]
    body = json.dumps({"detail": f"something {code}", "code": code}).encode()
    err = errors.error_from_body(status, body)
    assert type(err) is errors._BY_CODE[code]
    assert (err.status, err.code, err.detail) == (status, code, f"something {code}")
    # What caught the answer by its status before still catches it.
    assert isinstance(err, errors._class_for(status))
    assert isinstance(err, errors.APIError)


def test_the_codes_guessed_from_a_bare_status_are_codes_of_that_status() -> None:
    for status, code in errors._CODE_BY_STATUS.items():
        assert code in CODES, code
        if code != "unauthorized":  # a bare 403 is read as an auth failure
            assert CODES[code] == status, code


def test_a_code_that_does_not_go_with_the_status_gets_the_status_class() -> None:
    # A method a route does not have: 405 with code bad_request.
    err = errors.error_from_body(405, b'{"detail": "method GET", "code": "bad_request"}')
    assert type(err) is errors.BadRequestError
    # A code that would escape the status's class is not trusted.
    err = errors.error_from_body(404, b'{"detail": "x", "code": "quota_exceeded"}')
    assert type(err) is errors.NotFoundError
    # Unknown codes (a newer server's, or the agent's) keep the status class and the code.
    err = errors.error_from_body(409, b'{"detail": "x", "code": "sandbox_paused"}')
    assert (type(err), err.code) == (errors.ConflictError, "sandbox_paused")
    err = errors.error_from_body(400, b'{"code": "cwd_not_found", "message": "no /x"}')
    assert (type(err), err.code) == (errors.BadRequestError, "cwd_not_found")

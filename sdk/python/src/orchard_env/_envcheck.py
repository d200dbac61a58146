"""``check_env``: how a sandbox's shells are set up, as Orchard's SDK reports it.

Sans I/O: the probe commands, the operation that runs them (:func:`check`, run by either
client's driver) and how their output becomes the report. Two probes run:
a bare one (``bash -c``, no ``~/.bashrc``) and a login-shell one (``login_shell=True``,
which sources ``~/.bashrc`` past its non-interactive guard). ``~/.bashrc`` counts as
loaded when it exists and the login shell's environment differs from the bare one
(``PATH``, or ``HISTCONTROL``, which nearly every stock bashrc sets). A conda found on
the login PATH is tried once more, because a conda whose Python package is gone still
defines the shell function but fails with ``ModuleNotFoundError``.
"""

from __future__ import annotations

from typing import Any

from ._http import Op
from ._ops import exec_job
from .models import JobResult

#: The bare probe: the baseline PATH and HISTCONTROL.
BARE_PROBE = 'echo "__BARE_PATH=$PATH"; echo "__BARE_HISTCONTROL=${HISTCONTROL:-}"'

#: The login-shell probe.
LOGIN_PROBE = "; ".join(
    [
        'echo "__HAS_BASHRC=$( [ -f ~/.bashrc ] && echo yes || echo no )"',
        'echo "__HISTCONTROL=${HISTCONTROL:-}"',
        'echo "__HAS_CONDA=$(command -v conda >/dev/null 2>&1 && echo yes || echo no)"',
        'echo "__CONDA_DEFAULT_ENV=${CONDA_DEFAULT_ENV:-}"',
        'echo "__CONDA_PREFIX=${CONDA_PREFIX:-}"',
        'echo "__CONDA_EXE=${CONDA_EXE:-none}"',
        'echo "__PATH=$PATH"',
        'echo "__PYTHON=$(command -v python 2>/dev/null || echo none)"',
        'echo "__PYTHON3=$(command -v python3 2>/dev/null || echo none)"',
        'echo "__PYTHON_VERSION=$(python --version 2>&1 || python3 --version 2>&1 || echo none)"',
    ]
)

#: Seconds each probe may take.
PROBE_TIMEOUT = 15


def check(sandbox_id: str, wait_limit: float) -> Op[dict[str, Any]]:
    """Runs the probes as compatible jobs (as ``exec`` does, each waited for at most
    ``wait_limit`` seconds) and answers the report."""

    def probe(command: str, login_shell: bool = False) -> Op[JobResult]:
        return exec_job(
            sandbox_id,
            command,
            timeout=PROBE_TIMEOUT,
            wait_limit=wait_limit,
            login_shell=login_shell,
        )

    bare = yield from probe(BARE_PROBE)
    login = yield from probe(LOGIN_PROBE, login_shell=True)
    login_info = parse_probe(login.stdout)
    conda_output = None
    conda_cmd = conda_check_command(login_info)
    if conda_cmd is not None:
        tried = yield from probe(conda_cmd)
        conda_output = tried.stdout + tried.stderr
    return report(parse_probe(bare.stdout), login_info, conda_output)


def parse_probe(stdout: str) -> dict[str, str]:
    """``__KEY=value`` lines of a probe's output.

    >>> parse_probe("noise\\n__PATH=/bin:/usr/bin\\n__HAS_CONDA=no\\n")
    {'PATH': '/bin:/usr/bin', 'HAS_CONDA': 'no'}
    """
    out: dict[str, str] = {}
    for line in (stdout or "").splitlines():
        if line.startswith("__") and "=" in line:
            key, _, value = line.partition("=")
            out[key.lstrip("_")] = value
    return out


def conda_check_command(login: dict[str, str]) -> str | None:
    """The command that tries the conda found by the login probe, if any."""
    exe = login.get("CONDA_EXE", "none")
    if login.get("HAS_CONDA") == "yes" and exe and exe != "none":
        return f"{_quote(exe)} --version 2>&1 || true"
    return None


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def report(bare: dict[str, str], login: dict[str, str], conda_output: str | None) -> dict[str, Any]:
    """The ``check_env`` dict from both probes (and the conda try, when there was one).

    >>> r = report({"BARE_PATH": "/bin"}, {"HAS_BASHRC": "yes", "PATH": "/opt/c/bin:/bin",
    ...     "HAS_CONDA": "yes", "CONDA_DEFAULT_ENV": "testbed", "CONDA_EXE": "/opt/c/bin/conda",
    ...     "PYTHON": "/opt/c/bin/python"}, "conda 23.1.0")
    >>> r["bashrc_loaded"], r["conda_available"], r["conda_env"], r["bare_path"]
    (True, True, 'testbed', '/bin')
    """
    bare_path = bare.get("BARE_PATH", "")
    login_path = login.get("PATH", "")
    has_bashrc = login.get("HAS_BASHRC", "no") == "yes"
    changed = (
        login.get("HISTCONTROL", "") != bare.get("BARE_HISTCONTROL", "") or login_path != bare_path
    )
    conda_found = login.get("HAS_CONDA", "no") == "yes"
    conda_broken = conda_output is not None and "ModuleNotFoundError" in conda_output
    return {
        "bashrc_loaded": has_bashrc and changed,
        "has_bashrc": has_bashrc,
        "conda_available": conda_found and not conda_broken,
        "conda_broken": conda_broken,
        "conda_exe": login.get("CONDA_EXE", "none"),
        "conda_env": login.get("CONDA_DEFAULT_ENV") or None,
        "conda_prefix": login.get("CONDA_PREFIX") or None,
        "path": login_path,
        "bare_path": bare_path,
        "python": login.get("PYTHON", "none"),
        "python3": login.get("PYTHON3", "none"),
        "python_version": login.get("PYTHON_VERSION", "none"),
    }


def _cut(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[:n] + "..."


def summary(sandbox_id: str, info: dict[str, Any]) -> str:
    """The text ``check_env(verbose=True)`` prints."""
    lines = [
        f"[{sandbox_id[:12]}] === Environment Check ===",
        f"  ~/.bashrc exists: {'yes' if info['has_bashrc'] else 'no'}",
        f"  bashrc loaded   : {'yes' if info['bashrc_loaded'] else 'NO'}",
    ]
    if info["conda_broken"]:
        lines.append(f"  conda available : BROKEN (module missing in {info['conda_exe']})")
    else:
        lines.append(f"  conda available : {'yes' if info['conda_available'] else 'no'}")
    if info["conda_available"]:
        lines.append(f"  conda env       : {info['conda_env'] or '(none)'}")
        lines.append(f"  conda prefix    : {info['conda_prefix'] or '(none)'}")
    lines += [
        f"  python          : {info['python']}",
        f"  python3         : {info['python3']}",
        f"  python version  : {info['python_version']}",
        f"  PATH (login)    : {_cut(info['path'])}",
    ]
    if info["path"] != info["bare_path"]:
        lines.append(f"  PATH (bare)     : {_cut(info['bare_path'])}")
    return "\n".join(lines)

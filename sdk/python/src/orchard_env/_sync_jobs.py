# generated from _aio_jobs.py by scripts/unasync.py; do not edit
"""The Orchard-compatible API of a sandbox: :class:`SandboxJobs` (commands as
jobs, terminals, patches, base64 files, the shell check), a base of
:class:`~orchard_env.SandboxInstance`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal, overload

from . import _envcheck, _ops
from ._sync_core import Command, SandboxCore
from .models import FileEntry, JobResult, PatchResult
from .pty import ContainerProcess


class SandboxJobs(SandboxCore):
    """The compatible methods of :class:`~orchard_env.SandboxInstance`."""

    @overload
    def exec(
        self,
        command: Command,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        poll_interval: float = 0.1,
        login_shell: bool = False,
        pty: Literal[False] = False,
        rows: int = 24,
        cols: int = 80,
    ) -> JobResult: ...

    @overload
    def exec(
        self,
        command: Command,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        poll_interval: float = 0.1,
        login_shell: bool = False,
        *,
        pty: Literal[True],
        rows: int = 24,
        cols: int = 80,
    ) -> ContainerProcess: ...

    def exec(
        self,
        command: Command,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        poll_interval: float = 0.1,
        login_shell: bool = False,
        pty: bool = False,
        rows: int = 24,
        cols: int = 80,
    ) -> JobResult | ContainerProcess:
        """Runs ``command`` (a shell string, or an argv list) and waits for it.

        Through the compatible jobs API: commands of one sandbox run one at a time, in
        order. ``timeout`` is the command's time limit in seconds. Returns a
        :class:`~orchard_env.JobResult` (not an exception) for a non-zero exit; with
        ``wait=False``, the queued job at once (:meth:`get_job` follows it). The wait is
        server-side, so ``poll_interval`` is accepted for compatibility and not needed.
        With ``pty=True`` the command runs on a ``rows`` x ``cols`` terminal and a
        :class:`~orchard_env.ContainerProcess` is returned at once.

        >>> sandbox.exec(["echo", "a b"]).stdout
        'a b\\n'
        >>> sandbox.exec("pwd", cwd="/tmp").stdout
        '/tmp\\n'
        """
        del poll_interval  # waits block server-side
        self._check()
        if pty:
            return self._open_compat_pty(
                command, cwd=cwd, env=env, login_shell=login_shell, rows=rows, cols=cols
            )
        if not wait:
            job_id = self._driver.run(
                _ops.submit_job(
                    self.sandbox_id,
                    command,
                    timeout=timeout,
                    cwd=cwd,
                    env=env,
                    login_shell=login_shell,
                )
            )
            return _ops.queued_job(job_id, self.sandbox_id, command)
        return self._driver.run(
            _ops.exec_job(
                self.sandbox_id,
                command,
                timeout=timeout,
                wait_limit=self._client._state.job_wait_limit(timeout),
                cwd=cwd,
                env=env,
                login_shell=login_shell,
            )
        )

    def _open_compat_pty(
        self,
        command: Command,
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        login_shell: bool,
        rows: int = 24,
        cols: int = 80,
    ) -> ContainerProcess:
        init = _ops.pty_init_frame(
            command, cwd=cwd, env=env, rows=rows, cols=cols, login_shell=login_shell
        )
        target = self._ws_target(_ops.compat_pty_paths(self.sandbox_id))
        return ContainerProcess.open(target, init=init)

    def get_job(self, job_id: str) -> JobResult:
        """A job by id, as it is now."""
        return self._driver.run(_ops.get_job(job_id))

    def wait_job(self, job_id: str, timeout: float | None = None) -> JobResult:
        """Waits for a job to finish (at most ``timeout`` seconds) and returns it."""
        return self._driver.run(_ops.wait_job(job_id, timeout))

    def apply_patch(self, patch: str, timeout: float = 30) -> PatchResult:
        """Applies a unified diff in the working directory (``git apply`` semantics).

        Returns ``{"success", "stdout", "stderr", "exit_code", "error"}``.
        """
        self._check()
        return self._driver.run(_ops.apply_patch(self.sandbox_id, patch, timeout))

    def upload_content(self, content: bytes | str, remote_path: str) -> dict[str, Any]:
        """Writes ``content`` to the file ``remote_path`` (compatible route, base64 JSON).

        >>> sandbox.upload_content("hello", "/tmp/hello.txt")["size"]
        5
        >>> sandbox.download_content("/tmp/hello.txt")
        b'hello'
        """
        self._check()
        data = content.encode() if isinstance(content, str) else bytes(content)
        return self._driver.run(_ops.upload_content(self.sandbox_id, data, remote_path))

    def upload_file(self, local_path: str | os.PathLike[str], remote_path: str) -> dict[str, Any]:
        """Uploads the local file ``local_path`` to ``remote_path`` (compatible route):
        ``{"success", "path", "size"}``."""
        self._check()
        with open(local_path, "rb") as f:
            data = f.read()
        return self._driver.run(_ops.upload_content(self.sandbox_id, data, remote_path))

    def download_content(self, remote_path: str) -> bytes:
        """The bytes of the file ``remote_path`` (compatible route)."""
        self._check()
        return self._driver.run(_ops.download_content(self.sandbox_id, remote_path))

    def download_file(self, remote_path: str, local_path: str | os.PathLike[str]) -> int:
        """Saves the file ``remote_path`` as ``local_path``; returns the bytes written."""
        self._check()
        data = self._driver.run(_ops.download_content(self.sandbox_id, remote_path))
        with open(local_path, "wb") as f:
            f.write(data)
        return len(data)

    def list_files(self, remote_path: str = "/") -> list[FileEntry]:
        """Entries of a directory: ``{"name", "type": "file"|"directory", "size", "modified"}``."""
        self._check()
        return self._driver.run(_ops.list_files(self.sandbox_id, remote_path))

    def check_env(self, verbose: bool = True) -> dict[str, Any]:
        """How the sandbox's shells are set up, from a bare and a login-shell probe.

        Keys: ``bashrc_loaded``, ``conda_available``, ``conda_env``, ``conda_prefix``,
        ``path`` (login shell), ``bare_path``, ``python``, ``python3``,
        ``python_version`` (and ``has_bashrc``, ``conda_broken``, ``conda_exe``). With
        ``verbose`` a summary is printed.
        """
        self._check()
        wait_limit = self._client._state.job_wait_limit(_envcheck.PROBE_TIMEOUT)
        info = self._driver.run(_envcheck.check(self.sandbox_id, wait_limit))
        if verbose:
            print(_envcheck.summary(self.sandbox_id, info))
        return info

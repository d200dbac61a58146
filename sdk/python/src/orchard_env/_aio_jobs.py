"""The Orchard-compatible API of a sandbox: :class:`AsyncSandboxJobs` (commands as
jobs, terminals, patches, base64 files, the shell check), a base of
:class:`~orchard_env.AsyncSandboxInstance`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal, overload

from . import _envcheck, _ops
from ._aio_core import AsyncSandboxCore, Command
from .models import FileEntry, JobResult, PatchResult
from .pty import AsyncContainerProcess


class AsyncSandboxJobs(AsyncSandboxCore):
    """The compatible methods of :class:`~orchard_env.AsyncSandboxInstance`."""

    @overload
    async def exec(
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
    async def exec(
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
    ) -> AsyncContainerProcess: ...

    async def exec(
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
    ) -> JobResult | AsyncContainerProcess:
        """Runs ``command`` through the jobs API (see :meth:`SandboxInstance.exec`)."""
        del poll_interval  # waits block server-side
        self._check()
        if pty:
            return await self._open_compat_pty(
                command, cwd=cwd, env=env, login_shell=login_shell, rows=rows, cols=cols
            )
        if not wait:
            job_id = await self._driver.run(
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
        return await self._driver.run(
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

    async def _open_compat_pty(
        self,
        command: Command,
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        login_shell: bool,
        rows: int = 24,
        cols: int = 80,
    ) -> AsyncContainerProcess:
        init = _ops.pty_init_frame(
            command, cwd=cwd, env=env, rows=rows, cols=cols, login_shell=login_shell
        )
        target = await self._ws_target(_ops.compat_pty_paths(self.sandbox_id))
        return await AsyncContainerProcess.open(target, init=init)

    async def get_job(self, job_id: str) -> JobResult:
        """A job by id, as it is now."""
        return await self._driver.run(_ops.get_job(job_id))

    async def wait_job(self, job_id: str, timeout: float | None = None) -> JobResult:
        """Waits for a job to finish (at most ``timeout`` seconds) and returns it."""
        return await self._driver.run(_ops.wait_job(job_id, timeout))

    async def apply_patch(self, patch: str, timeout: float = 30) -> PatchResult:
        """Applies a unified diff in the working directory (``git apply`` semantics).

        Returns ``{"success", "stdout", "stderr", "exit_code", "error"}``.
        """
        self._check()
        return await self._driver.run(_ops.apply_patch(self.sandbox_id, patch, timeout))

    async def upload_content(self, content: bytes | str, remote_path: str) -> dict[str, Any]:
        """Writes ``content`` to the file ``remote_path`` (compatible route)."""
        self._check()
        data = content.encode() if isinstance(content, str) else bytes(content)
        return await self._driver.run(_ops.upload_content(self.sandbox_id, data, remote_path))

    async def upload_file(
        self, local_path: str | os.PathLike[str], remote_path: str
    ) -> dict[str, Any]:
        """Uploads the local file ``local_path`` to ``remote_path`` (compatible route):
        ``{"success", "path", "size"}``."""
        self._check()
        with open(local_path, "rb") as f:
            data = f.read()
        return await self._driver.run(_ops.upload_content(self.sandbox_id, data, remote_path))

    async def download_content(self, remote_path: str) -> bytes:
        """The bytes of the file ``remote_path`` (compatible route)."""
        self._check()
        return await self._driver.run(_ops.download_content(self.sandbox_id, remote_path))

    async def download_file(self, remote_path: str, local_path: str | os.PathLike[str]) -> int:
        """Saves the file ``remote_path`` as ``local_path``; returns the bytes written."""
        self._check()
        data = await self._driver.run(_ops.download_content(self.sandbox_id, remote_path))
        with open(local_path, "wb") as f:
            f.write(data)
        return len(data)

    async def list_files(self, remote_path: str = "/") -> list[FileEntry]:
        """Entries of a directory: ``{"name", "type": "file"|"directory", "size", "modified"}``."""
        self._check()
        return await self._driver.run(_ops.list_files(self.sandbox_id, remote_path))

    async def check_env(self, verbose: bool = True) -> dict[str, Any]:
        """How the sandbox's shells are set up, from a bare and a login-shell probe.

        Keys: ``bashrc_loaded``, ``conda_available``, ``conda_env``, ``conda_prefix``,
        ``path`` (login shell), ``bare_path``, ``python``, ``python3``,
        ``python_version`` (and ``has_bashrc``, ``conda_broken``, ``conda_exe``). With
        ``verbose`` a summary is printed.
        """
        self._check()
        wait_limit = self._client._state.job_wait_limit(_envcheck.PROBE_TIMEOUT)
        info = await self._driver.run(_envcheck.check(self.sandbox_id, wait_limit))
        if verbose:
            print(_envcheck.summary(self.sandbox_id, info))
        return info

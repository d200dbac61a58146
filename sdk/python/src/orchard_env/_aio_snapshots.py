"""Snapshots and forks on the client: :class:`AsyncClientSnapshots`, a base of
:class:`~orchard_env.AsyncSandboxClient` (a sandbox takes its own snapshot with
:meth:`~orchard_env.AsyncSandboxInstance.snapshot`)."""

from __future__ import annotations

from collections.abc import Mapping

from . import _ops
from ._aio_core import AsyncClientCore
from ._aio_sandbox import AsyncSandboxInstance
from ._base import check_started
from .models import Snapshot


class AsyncClientSnapshots(AsyncClientCore):
    """The snapshot methods of :class:`~orchard_env.AsyncSandboxClient`."""

    async def fork(
        self,
        snapshot: Snapshot | str,
        k: int = 1,
        *,
        labels: Mapping[str, str] | None = None,
        ttl_s: float | None = None,
        ready_timeout_s: float | None = None,
        direct: bool | None = None,
    ) -> list[AsyncSandboxInstance]:
        """Starts ``k`` sandboxes from a snapshot (or its id) and returns them ready (see
        :meth:`SandboxClient.fork`): handles like :meth:`create_sandbox`'s (``async
        with``; owned and cleaned up by this client), with the snapshot's files and shell
        sessions. Running processes are not carried into forks (no process
        checkpointing: CRIU is not available on the servers' kernel). Forks share the
        snapshot's layers, and it cannot be deleted while any of them exists."""
        infos = await self._driver.run(
            _ops.fork_snapshot(
                _ops.snapshot_id_of(snapshot),
                k,
                labels=labels,
                ttl_s=ttl_s,
                ready_timeout_s=ready_timeout_s,
            )
        )
        forks: list[AsyncSandboxInstance] = []
        for info in infos:
            self._state.own(info.sandbox_id)
            forks.append(AsyncSandboxInstance(self, info, direct=self._direct(direct)))
        try:
            for sandbox in forks:
                check_started(sandbox.info)
        except BaseException:
            for sandbox in forks:
                await self._delete_quietly(sandbox.sandbox_id)
            raise
        return forks

    async def list_snapshots(self) -> list[Snapshot]:
        """The snapshots this API key made, oldest first (``GET /v1/snapshots``)."""
        return await self._driver.run(_ops.list_snapshots())

    async def get_snapshot(self, snapshot: Snapshot | str) -> Snapshot:
        """A snapshot as it is now (``forks`` up to date), by id or
        :class:`~orchard_env.Snapshot` (:class:`~orchard_env.NotFoundError` if there is
        none)."""
        return await self._driver.run(_ops.get_snapshot(_ops.snapshot_id_of(snapshot)))

    async def delete_snapshot(self, snapshot: Snapshot | str) -> int:
        """Deletes a snapshot (by id or :class:`~orchard_env.Snapshot`); returns the disk
        bytes freed (layers no other snapshot or sandbox uses).

        A snapshot cannot be deleted while sandboxes forked from it exist: that raises
        :class:`~orchard_env.ConflictError` (409) naming them; delete the forks first.
        """
        return await self._driver.run(_ops.delete_snapshot(_ops.snapshot_id_of(snapshot)))

# generated from _aio_snapshots.py by scripts/unasync.py; do not edit
"""Snapshots and forks on the client: :class:`ClientSnapshots`, a base of
:class:`~orchard_env.SandboxClient` (a sandbox takes its own snapshot with
:meth:`~orchard_env.SandboxInstance.snapshot`)."""

from __future__ import annotations

from collections.abc import Mapping

from . import _ops
from ._base import check_started
from ._sync_core import ClientCore
from ._sync_sandbox import SandboxInstance
from .models import Snapshot


class ClientSnapshots(ClientCore):
    """The snapshot methods of :class:`~orchard_env.SandboxClient`."""

    def fork(
        self,
        snapshot: Snapshot | str,
        k: int = 1,
        *,
        labels: Mapping[str, str] | None = None,
        ttl_s: float | None = None,
        ready_timeout_s: float | None = None,
        direct: bool | None = None,
    ) -> list[SandboxInstance]:
        """Starts ``k`` sandboxes (1 to 64) from ``snapshot`` (a
        :class:`~orchard_env.Snapshot` or its id) and returns them once all are ready.

        Each fork is a sandbox like those :meth:`create_sandbox` makes (a context
        manager; owned by this client and deleted by its cleanup) with the snapshot's
        filesystem, image, environment variables, CPU, memory and network, and its shell
        sessions back (the same session ids, working directories, exported variables and
        functions: :meth:`SandboxInstance.get_session` finds them). Running processes
        are not carried into forks: snapshots do not capture them (no process
        checkpointing; CRIU is not available on the servers' kernel), so a fork starts
        with no process but its agent and its restored sessions. The forks share the
        snapshot's layers (nothing is copied; each writes to its own layer, so they
        diverge independently), and the snapshot cannot be deleted while any of them
        exists. ``labels`` are the forks' labels; ``ttl_s`` is how long each fork lives
        (the server's default when ``None``, 0 until deleted); ``ready_timeout_s`` how
        long readiness may take; ``direct`` as in :meth:`create_sandbox`. All or
        nothing: if one fork cannot start, none is left (:class:`~orchard_env.SandboxError`).

        >>> with client.create_sandbox("busybox:latest") as parent:
        ...     _ = parent.write_file("/workspace/turn", "3")
        ...     snap = parent.snapshot()
        >>> forks = client.fork(snap, 2)
        >>> [f.read_file("/workspace/turn") for f in forks]
        [b'3', b'3']
        >>> for f in forks:
        ...     f.delete()
        >>> client.delete_snapshot(snap) >= 0
        True
        """
        infos = self._driver.run(
            _ops.fork_snapshot(
                _ops.snapshot_id_of(snapshot),
                k,
                labels=labels,
                ttl_s=ttl_s,
                ready_timeout_s=ready_timeout_s,
            )
        )
        forks: list[SandboxInstance] = []
        for info in infos:
            self._state.own(info.sandbox_id)
            forks.append(SandboxInstance(self, info, direct=self._direct(direct)))
        try:
            for sandbox in forks:
                check_started(sandbox.info)
        except BaseException:
            for sandbox in forks:
                self._delete_quietly(sandbox.sandbox_id)
            raise
        return forks

    def list_snapshots(self) -> list[Snapshot]:
        """The snapshots this API key made, oldest first (``GET /v1/snapshots``)."""
        return self._driver.run(_ops.list_snapshots())

    def get_snapshot(self, snapshot: Snapshot | str) -> Snapshot:
        """A snapshot as it is now (``forks`` up to date), by id or
        :class:`~orchard_env.Snapshot` (:class:`~orchard_env.NotFoundError` if there is
        none)."""
        return self._driver.run(_ops.get_snapshot(_ops.snapshot_id_of(snapshot)))

    def delete_snapshot(self, snapshot: Snapshot | str) -> int:
        """Deletes a snapshot (by id or :class:`~orchard_env.Snapshot`); returns the disk
        bytes freed (layers no other snapshot or sandbox uses).

        A snapshot cannot be deleted while sandboxes forked from it exist: that raises
        :class:`~orchard_env.ConflictError` (409) naming them; delete the forks first.
        """
        return self._driver.run(_ops.delete_snapshot(_ops.snapshot_id_of(snapshot)))

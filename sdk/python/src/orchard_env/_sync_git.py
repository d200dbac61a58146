# generated from _aio_git.py by scripts/unasync.py; do not edit
"""Git repositories in a sandbox through the ``/v1`` agent API: :class:`SandboxGit`,
a base of :class:`~orchard_env.SandboxInstance`."""

from __future__ import annotations

from . import _ops
from ._sync_core import SandboxCore
from .models import GitApplyResult, GitCommitResult, GitDiff, GitResetResult, GitStatus


class SandboxGit(SandboxCore):
    """The git methods of :class:`~orchard_env.SandboxInstance`."""

    def git_status(self, repo: str) -> GitStatus:
        """Branch, HEAD and changed paths of the repository at ``repo``."""
        return self._run(_ops.git_status(repo))

    def git_diff(
        self,
        repo: str,
        *,
        base: str | None = None,
        include_untracked: bool = True,
        binary: bool = True,
    ) -> GitDiff:
        """The work tree against ``base`` (default HEAD) as a patch ``git apply`` accepts."""
        return self._run(_ops.git_diff(repo, base, include_untracked, binary))

    def git_apply(
        self, repo: str, patch: str, *, check_only: bool = False, fuzzy: bool = False
    ) -> GitApplyResult:
        """Applies ``patch`` all or nothing; a patch that does not apply is reported in
        ``conflicts``, not raised."""
        return self._run(_ops.git_apply(repo, patch, check_only, fuzzy))

    def git_commit(
        self,
        repo: str,
        message: str,
        *,
        author_name: str | None = None,
        author_email: str | None = None,
        allow_empty: bool = False,
    ) -> GitCommitResult:
        """Stages everything and commits it on HEAD."""
        return self._run(_ops.git_commit(repo, message, author_name, author_email, allow_empty))

    def git_reset(
        self,
        repo: str,
        target: str | None = None,
        *,
        clean_untracked: bool = True,
        keep_ignored: bool = True,
    ) -> GitResetResult:
        """Hard reset to ``target`` (default HEAD), removing untracked files by default."""
        return self._run(_ops.git_reset(repo, target, clean_untracked, keep_ignored))

# generated from _aio_git.py by scripts/unasync.py; do not edit
"""Git in a sandbox, through ``/v1``: the methods :class:`SandboxInstance` has
from :class:`GitOps` (status, diff, apply, commit, reset)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _ops
from .models import GitApplyResult, GitCommitResult, GitDiff, GitResetResult, GitStatus

if TYPE_CHECKING:
    from ._http import Op


class GitOps:
    """A repository's status, diffs and patches (a part of :class:`SandboxInstance`)."""

    if TYPE_CHECKING:

        def _run(self, op: Op[Any]) -> Any: ...

    # --- /v1: git --------------------------------------------------------------------------

    def git_status(self, repo: str) -> GitStatus:
        """Branch, HEAD and changed paths of the repository at ``repo``."""
        result: GitStatus = self._run(_ops.git_status(repo))
        return result

    def git_diff(
        self,
        repo: str,
        *,
        base: str | None = None,
        include_untracked: bool = True,
        binary: bool = True,
    ) -> GitDiff:
        """The work tree against ``base`` (default HEAD) as a patch ``git apply`` accepts."""
        result: GitDiff = self._run(_ops.git_diff(repo, base, include_untracked, binary))
        return result

    def git_apply(
        self, repo: str, patch: str, *, check_only: bool = False, fuzzy: bool = False
    ) -> GitApplyResult:
        """Applies ``patch`` all or nothing; a patch that does not apply is reported in
        ``conflicts``, not raised."""
        result: GitApplyResult = self._run(_ops.git_apply(repo, patch, check_only, fuzzy))
        return result

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
        result: GitCommitResult = self._run(
            _ops.git_commit(repo, message, author_name, author_email, allow_empty)
        )
        return result

    def git_reset(
        self,
        repo: str,
        target: str | None = None,
        *,
        clean_untracked: bool = True,
        keep_ignored: bool = True,
    ) -> GitResetResult:
        """Hard reset to ``target`` (default HEAD), removing untracked files by default."""
        result: GitResetResult = self._run(
            _ops.git_reset(repo, target, clean_untracked, keep_ignored)
        )
        return result

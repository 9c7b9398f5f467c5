"""Git: one commit per applied patch, with provenance trailers (GitPython).

A commit records exactly the files its patch rewrote and nothing else: each
is made with ``git commit --only -- <paths>``, which commits those paths'
work-tree contents and leaves anything else the user staged staged and
uncommitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch import __version__
from deepstack_patch.distribution.quilt import (
    PatchStep,
    plan_steps,
    steps_of,
    upstream_reference,
    vllm_named,
)
from deepstack_patch.engine.apply import (
    LeftOut,
    mark_applied,
    plan_leaving_out_drifted,
    refuse_blocked,
    refuse_unchecked,
)
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.locks import tree_lock
from deepstack_patch.engine.plan import FileEdit, Plan, plan_tree
from deepstack_patch.engine.protocol import Patch, PatchState
from deepstack_patch.engine.transaction import write_edits
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.output.upstream import origin_words, upstream_commit

if TYPE_CHECKING:
    import git


@dataclass(frozen=True)
class CommitRecord:
    patch_id: str
    sha: str
    files: list[str]


@dataclass
class CommitResult:
    """What ``apply --commit`` did: the plan, the files, one commit per patch."""

    plan: Plan
    touched: list[str] = field(default_factory=list)
    commits: list[CommitRecord] = field(default_factory=list)
    #: HEAD was detached: the commits are on no branch.
    detached: bool = False
    #: With ``skip_drifted``: the patches left out (``engine.apply``).
    left_out: list[LeftOut] = field(default_factory=list)

    @property
    def drifted(self) -> bool:
        return any(
            r.selected and r.state is PatchState.DRIFTED for r in self.plan.reports
        )


def commit_series(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    allow_dirty: bool,
    unchecked_names: bool = False,
    skip_drifted: bool = False,
    progress: Callable[[str], None] | None = None,
) -> CommitResult:
    """Apply the needed patches of ``series`` as one git commit each;
    ``progress`` is called with each file the plan reads.

    A drifted selected patch commits nothing: the result says so, unless
    ``skip_drifted`` leaves it out (``engine.apply.plan_leaving_out_drifted``).
    A dirty work tree (or a dirty file a patch rewrites) is refused before
    any write, as is, unless ``unchecked_names``, a derived patch whose
    runtime names were not checked (``apply_tree``).
    """
    repo = open_repository(tree)
    with tree_lock(tree.root):
        left_out: list[LeftOut] = []
        if skip_drifted:
            plan, left_out = plan_leaving_out_drifted(
                lambda chosen: plan_tree(tree, series, chosen, progress=progress),
                selected,
            )
            steps = steps_of(plan, series)
        else:
            plan, steps = plan_steps(tree, series, selected, progress)
        result = CommitResult(plan, left_out=left_out)
        if result.drifted:
            return result
        refuse_blocked(plan)
        if not unchecked_names:
            refuse_unchecked(plan)
        result.touched = sorted({e.relpath for step in steps for e in step.edits})
        added = {e.relpath for step in steps for e in step.edits if e.action == "add"}
        check_work_tree(repo, tree, result.touched, allow_dirty, added)
        result.commits = commit_steps(repo, tree, steps)
        mark_applied(plan, [c.patch_id for c in result.commits])
    result.detached = bool(result.commits) and repo.head.is_detached
    return result


def open_repository(tree: VllmTree) -> git.Repo:
    """The git repository whose work tree holds ``tree``."""
    try:
        import git
    except ImportError:
        raise DeepstackError(
            "--commit needs GitPython, which is not installed",
            "pip install 'deepstack-patch[vendor]'",
        ) from None
    try:
        repo = git.Repo(tree.root, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise DeepstackError(
            f"--commit: {tree.root} is not inside a git work tree",
            "run `git init && git add -A && git commit -m 'vLLM <version>'` "
            "there first, or apply without --commit",
        ) from None
    if repo.bare or repo.working_tree_dir is None:
        raise DeepstackError(
            f"--commit: {repo.git_dir} is a bare repository",
            "commit in a work tree of it (git worktree add PATH, or a clone), "
            "or apply without --commit",
        )
    if not repo.head.is_valid():
        _refuse_unsafe_repository(repo)
        raise DeepstackError(
            f"--commit: the repository at {repo.working_tree_dir} has no commit yet",
            "commit the vLLM tree first, so the patches are commits on top of it",
        )
    return repo


def _refuse_unsafe_repository(repo: git.Repo) -> None:
    """git's "dubious ownership" refusal looks like an empty repository."""
    import git

    try:
        repo.git.rev_parse("--git-dir")
    except git.GitCommandError as exc:
        if "dubious ownership" in str(exc.stderr):
            top = repo.working_tree_dir
            raise DeepstackError(
                f"--commit: git refuses the repository at {top}: it is owned by "
                "another user (git's 'dubious ownership' check)",
                f"if you trust it: git config --global --add safe.directory {top}",
            ) from None


def repo_path(repo: git.Repo, tree: VllmTree, relpath: str) -> str:
    """A tree-relative path as a path relative to the repository's top."""
    top = Path(repo.working_tree_dir or "").resolve()
    return (tree.root / relpath).relative_to(top).as_posix()


def dirty_paths(repo: git.Repo, tree: VllmTree) -> list[str]:
    """Changed, staged and untracked (not ignored) paths under the tree."""
    scope = repo_path(repo, tree, ".")
    # git status refreshes the index's stat cache when it can take the lock,
    # rewriting .git/index wherever a tracked file's stat data moved (its
    # ctime does when another hard link to it is made): a refused --commit
    # must leave .git as it found it, so that refresh is turned off.
    output = repo.git(no_optional_locks=True).status(
        "--porcelain=v1", "-z", "--untracked-files=all", scope
    )
    entries = output.split("\0")
    paths: list[str] = []
    index = 0
    while index < len(entries):
        entry = entries[index]
        index += 1
        if not entry:
            continue
        paths.append(entry[3:])
        if entry[0] in "RC":  # a rename's source path follows as its own entry
            index += 1
    return paths


def check_work_tree(
    repo: git.Repo,
    tree: VllmTree,
    touched: Sequence[str],
    allow_dirty: bool,
    added: Collection[str] = (),
) -> None:
    """Refuse a dirty tree, and anything that would commit unrelated changes.

    Even with ``allow_dirty``, a file the patches rewrite or delete must be
    tracked and unchanged: committing it would otherwise commit the user's
    edits too. A file a patch adds (``added``) is absent: the plan read so.
    """
    dirty = dirty_paths(repo, tree)
    if dirty and not allow_dirty:
        more = f" and {len(dirty) - 5} more" if len(dirty) > 5 else ""
        shown = ", ".join(dirty[:5]) + more
        raise DeepstackError(
            f"--commit: the work tree at {repo.working_tree_dir} has uncommitted "
            f"changes ({shown})",
            "commit or stash them first, or add --allow-dirty (only the files "
            "the patches rewrite are committed)",
        )
    paths = {
        repo_path(repo, tree, relpath): relpath
        for relpath in touched
        if relpath not in added
    }
    tracked = set(repo.git.ls_files("-z", "--", *paths).split("\0")) if paths else set()
    for path in paths:
        if path not in tracked:
            raise DeepstackError(
                f"--commit: {path} is not tracked by git, and a patch rewrites it",
                f"commit it first (git add {path} && git commit), so the patch "
                "commit holds only the fix",
            )
        if path in dirty:
            raise DeepstackError(
                f"--commit: {path} has uncommitted changes, and a patch rewrites "
                "it; committing it would commit those changes too",
                f"commit or stash your changes to {path} first",
            )


def commit_message(patch: Patch, tree_version: str) -> str:
    """Title, provenance, then trailers (the last paragraph, ``Key: value``).

    A field the patch lacks (a derived patch's URL or first fixed release, a
    symptom) is left out rather than written empty.
    """
    if patch.upstream_url:
        source = f"Backport of {patch.upstream_url}"
    else:
        source = f"Backport of {patch.id}"
    where = [
        f"first released upstream in vLLM {patch.fixed_in}" if patch.fixed_in else "",
        origin_words(patch),
    ]
    provenance = "\n".join([source, ", ".join([*filter(None, where), "to"])])
    trailers = [f"Backport-of: {upstream_reference(patch)}"]
    if upstream_commit(patch):
        trailers.append(f"Upstream-commit: {upstream_commit(patch)}")
    if patch.fixed_in:
        trailers.append(f"Upstream-release: {patch.fixed_in}")
    paragraphs = [
        patch.title,
        f"{provenance} {vllm_named(tree_version)}.\n"
        f"Rewritten structurally by deepstack-patch {__version__} ({patch.id}).",
        patch.symptom,
        "\n".join(trailers),
    ]
    return "\n\n".join(p for p in paragraphs if p) + "\n"


def commit_steps(
    repo: git.Repo, tree: VllmTree, steps: Sequence[PatchStep]
) -> list[CommitRecord]:
    """Write and commit each step in order: one commit per patch, all or none.

    If a commit fails (a hook, an identity, a full disk), the commits this
    run made are undone: docs/vendor.md promises all the commits or nothing, and a
    half-applied series is what a vendor pipeline must never ship. The
    branch is reset to where it was (the undone commits stay in the reflog)
    and the touched files get their old content in the index and the work
    tree; other staged changes (--allow-dirty) are left as they were.
    """
    import git

    start = repo.head.commit.hexsha
    records: list[CommitRecord] = []
    for step in steps:
        written = write_edits(tree.root, step.edits)
        paths = [repo_path(repo, tree, relpath) for relpath in written]
        # A file the patch adds is new to git: --only commits tracked paths.
        added = [
            repo_path(repo, tree, e.relpath) for e in step.edits if e.action == "add"
        ]
        try:
            if added:
                repo.git.add("--", *added)
            # --only: commit these paths and nothing else staged; --no-verify:
            # the content is the tool's own, checked by its recogniser, and a
            # formatter hook rewriting it would break idempotence.
            repo.git.commit(
                "--only",
                "--no-verify",
                "--cleanup=verbatim",
                "-m",
                commit_message(step.patch, tree.version),
                "--",
                *paths,
            )
        except git.GitCommandError as exc:
            if added:  # unstaged: git never knew them before this step
                repo.git.reset("-q", "--", *added)
            write_edits(tree.root, [_reversed(e) for e in step.edits])
            undone = _undo_commits(repo, tree, start, records)
            raise _commit_failed(step.patch.id, exc, undone) from None
        records.append(
            CommitRecord(step.patch.id, repo.head.commit.hexsha, list(written))
        )
    return records


def _reversed(edit: FileEdit) -> FileEdit:
    """The edit that gives ``edit``'s file back: a file added is deleted, a
    file deleted added again."""
    back = {"add": "delete", "delete": "add"}.get(edit.action, "change")
    return dataclasses.replace(edit, old=edit.new, new=edit.old, action=back)


def _undo_commits(
    repo: git.Repo, tree: VllmTree, start: str, records: Sequence[CommitRecord]
) -> str:
    """Reset to ``start`` and restore the files the ``records`` committed
    (those added since ``start`` are removed)."""
    if not records:
        return ""
    paths = sorted(
        {repo_path(repo, tree, path) for record in records for path in record.files}
    )
    listed = repo.git.ls_tree("-r", "--name-only", "-z", start, "--", *paths)
    at_start = set(listed.split("\0")) - {""}
    repo.git.reset("--soft", start)
    new = [path for path in paths if path not in at_start]
    if new:
        repo.git.rm("-q", "-f", "--", *new)
    paths = [path for path in paths if path in at_start]
    if paths:
        repo.git.restore("--source", start, "--staged", "--worktree", "--", *paths)
    made = ", ".join(f"{r.patch_id} {r.sha[:12]}" for r in records)
    return f"; undid this run's commits ({made}): the branch is back at {start[:12]}"


def _commit_failed(patch_id: str, exc: git.GitCommandError, undone: str) -> Exception:
    stderr = str(exc.stderr).strip().strip("'").strip()
    hint = "fix the cause and run again"
    if "tell me who you are" in stderr or "user.email" in stderr:
        hint = (
            "set an identity: git config user.name 'Name' && "
            "git config user.email you@example.com"
        )
    elif "hook" in stderr or not stderr:
        hint = (
            "a git hook (e.g. prepare-commit-msg) refused the commit: fix it "
            "and run again"
        )
    return DeepstackError(
        f"git commit for {patch_id} failed: {stderr or exc}; its files were "
        f"restored{undone}; nothing was committed",
        hint,
    )

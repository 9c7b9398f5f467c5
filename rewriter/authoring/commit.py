"""``derive --commit``: a derived patch straight from a commit of a vLLM clone.

The diff is the commit against its parent; the base is the parent, read from
the object store (only the files the diff names, written once into the
cache), so the clone's work tree, index and HEAD are never touched and a bare
clone serves as well. Upstream squash-merges every pull request into one
commit whose subject ends in ``(#N)``: that gives the id ``vllm#N``, the
title and the pull request's URL. The base's version is ``git describe`` of
the parent, or ``--base-version``.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.authoring.derive import (
    DeriveResult,
    derive_patch_from_text,
    prepare_out,
    write_result,
)
from deepstack_patch.authoring.sources import check_version, pull_request_of
from deepstack_patch.authoring.unified_diff import parse_diff
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.tree import VllmTree

if TYPE_CHECKING:
    import git


@dataclass(frozen=True)
class CommitChange:
    """A commit read from a clone: what ``derive`` needs of it."""

    sha: str
    parent: str
    subject: str
    diff_text: str
    #: The pull request the subject names (``... (#N)``), else None.
    pull_request: int | None

    @property
    def short(self) -> str:
        return self.sha[:12]


def derive_commit(
    commit: str,
    *,
    repo: Path,
    out: Path,
    patch_id: str = "",
    tree_version: str | None = None,
    title: str = "",
    symptom: str = "",
    taken_ids: Sequence[str] = (),
    upstream_url: str = "",
    fixed_in: str = "",
    force: bool = False,
) -> DeriveResult:
    """Derive a patch from ``commit`` of the clone at ``repo`` on its parent,
    check it, and write its data file into ``out`` (with ``force``, in the
    place of the one there that holds its id)."""
    started = time.monotonic()
    clone = open_clone(repo)
    change = read_commit(clone, commit)
    named_by = "" if patch_id else "the commit's subject"
    patch_id = patch_id or _pull_request_id(change)
    if not upstream_url and change.pull_request is not None:
        upstream_url = pull_request_url(change.pull_request)
    replacing = prepare_out(
        out, patch_id, taken_ids, upstream_url, fixed_in, named_by, force
    )
    version, version_source = parent_version(clone, change, tree_version)
    files = parse_diff(change.diff_text, f"commit {change.short}")
    paths = sorted({f.path for f in files if f.path})
    base = VllmTree(parent_files(clone, change, paths), version, version_source)
    result = derive_patch_from_text(
        change.diff_text,
        base,
        patch_id,
        title=title or change.subject,
        symptom=symptom,
        diff_name=f"commit {change.short}",
        taken_ids=taken_ids,
        base_label=f"the parent of commit {change.short} ({change.parent[:12]})",
        upstream_url=upstream_url,
        fixed_in=fixed_in,
    )
    result.commit = result.patch.commit = change.sha
    result.warnings += far_past_tag(version, version_source)
    return write_result(result, out, started, replacing)


#: How many commits past its tag a described base may be before derive
#: warns: a vLLM release cycle is a few hundred commits, so a base further
#: from its tag most likely has a later release the clone has no tag for.
FAR_PAST_TAG = 1000


def far_past_tag(version: str, version_source: str) -> list[str]:
    """A warning where ``git describe`` read the base far past its tag (a
    clone whose tags stop long before the commit); else none."""
    match = re.fullmatch(r"(.+)-(\d+)-g[0-9a-f]+", version)
    if version_source != "git describe" or match is None:
        return []
    tag, commits = match.group(1), int(match.group(2))
    if commits <= FAR_PAST_TAG:
        return []
    return [
        f"the base is {version}, {commits} commits after the tag of vLLM "
        f"{tag}: the clone most likely lacks the tags of later releases; pass "
        "--base-version VERSION (the last vLLM release before the commit), or "
        "fetch the tags (git fetch --tags)"
    ]


def pull_request_url(number: int) -> str:
    return f"https://github.com/vllm-project/vllm/pull/{number}"


@dataclass(frozen=True)
class Clone:
    """A git repository, driven through GitPython's command wrapper run in
    its git directory: every command here reads the object store only, so a
    work tree, a bare clone and a mirror without a config read alike."""

    git_dir: Path
    runner: git.Git

    def run(self, *args: str) -> str:
        import git

        try:
            output = self.runner.execute(
                ["git", *args], stdout_as_string=False, strip_newline_in_stdout=False
            )
        except git.GitCommandError as exc:
            raise _git_failed(self.git_dir, exc) from None
        assert isinstance(output, bytes)
        try:
            return output.decode("utf-8")
        except UnicodeDecodeError:
            raise DeepstackError(
                f"git {args[0]} in {self.git_dir}: the output is not UTF-8 text",
                "give the diff of the fix's Python files with --diff instead",
            ) from None

    def blob(self, sha: str) -> bytes:
        import git

        try:
            output = self.runner.execute(
                ["git", "cat-file", "blob", sha],
                stdout_as_string=False,
                strip_newline_in_stdout=False,
            )
        except git.GitCommandError as exc:
            raise _git_failed(self.git_dir, exc) from None
        assert isinstance(output, bytes)
        return output


def open_clone(path: Path) -> Clone:
    """The git repository at (or above) ``path``: a work tree or a bare clone."""
    try:
        import git
    except ImportError:
        raise DeepstackError(
            "derive --commit needs GitPython, which is not installed",
            "pip install 'deepstack-patch[vendor]', or save the commit's diff "
            "(git show SHA > fix.diff) and give --diff with --base-src",
        ) from None
    if not path.is_dir():
        raise DeepstackError(
            f"--repo {path}: no such folder",
            "give a clone of vLLM with --repo PATH (a work tree or a bare clone)",
        )
    try:
        found = git.Git(path).execute(["git", "rev-parse", "--absolute-git-dir"])
    except git.GitCommandError as exc:
        if "dubious ownership" in str(exc.stderr):
            raise _git_failed(path, exc) from None
        raise DeepstackError(
            f"--repo {path}: not a git repository",
            "give a clone of vLLM with --repo PATH (a work tree or a bare clone), "
            "or run the command inside one",
        ) from None
    git_dir = Path(str(found).strip())
    return Clone(git_dir, git.Git(git_dir))


def read_commit(clone: Clone, commit: str) -> CommitChange:
    """The commit ``commit`` names, its parent, subject and diff."""
    import git

    try:
        sha, *parents = clone.runner.execute(
            ["git", "rev-list", "--parents", "-n", "1", "--end-of-options", commit]
        ).split()
    except git.GitCommandError as exc:
        if "dubious ownership" in str(exc.stderr):
            raise _git_failed(clone.git_dir, exc) from None
        raise DeepstackError(
            f"--commit {commit}: no such commit in {clone.git_dir}",
            f"git --git-dir {clone.git_dir} log --oneline shows its commits; "
            "fetch the one you want first",
        ) from None
    if not parents:
        raise DeepstackError(
            f"--commit {commit}: {sha[:12]} is a root commit, with no parent to "
            "be the base",
            "give the commit of a fix, whose parent is the code it fixes",
        )
    # A merge is taken against its first parent: the line it was merged into.
    parent = parents[0]
    diff = clone.run(
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--no-renames",
        "--unified=3",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        parent,
        sha,
    )
    subject = " ".join(clone.run("log", "-1", "--format=%s", sha).split())
    return CommitChange(
        sha=sha,
        parent=parent,
        subject=subject,
        diff_text=diff,
        pull_request=pull_request_of(subject),
    )


def parent_version(
    clone: Clone, change: CommitChange, tree_version: str | None
) -> tuple[str, str]:
    """The base's version and where it was read: ``--base-version``, else
    ``git describe --tags`` of the parent."""
    import git

    if tree_version is not None:
        return check_version(tree_version), "--base-version"
    try:
        described = clone.runner.execute(
            ["git", "describe", "--tags", change.parent]
        ).strip()
    except git.GitCommandError:
        raise DeepstackError(
            f"--commit {change.short}: git describe finds no tag before its "
            f"parent {change.parent[:12]}, so the base has no version",
            "pass --base-version VERSION: the last vLLM release before the "
            "commit (e.g. --base-version 0.20.2), or fetch the tags "
            "(git fetch --tags)",
        ) from None
    return described.removeprefix("v"), "git describe"


def parent_files(clone: Clone, change: CommitChange, paths: list[str]) -> Path:
    """A folder holding the parent's copy of ``paths`` (those it has), of
    the vllm modules they import from, and of ``vllm/__init__.py``, written
    once into the cache."""
    from deepstack_patch.engine.cache import cache_dir
    from deepstack_patch.engine.tree import ASKED_FOR
    from deepstack_patch.fetch.archives import write_once

    # The vllm modules the changed files import from, as the commit has
    # them: where a name the fix reads from another module is looked up.
    imported = {
        module_file
        for path in paths
        if path.startswith("vllm/") and path.endswith(".py")
        for module_file in imported_module_files(
            _text_at(clone, change.sha, path), path
        )
    }
    wanted = sorted({*paths, *imported, "vllm/__init__.py"})
    # "asked-for": a folder written before it listed (nothing) is not reused.
    salted = [change.parent, "asked-for", *wanted]
    key = hashlib.sha256("\0".join(salted).encode()).hexdigest()
    out = cache_dir() / "commit-trees" / f"{change.parent[:12]}-{key[:16]}"
    if out.is_dir():
        return out
    # "mode type sha\tpath" for each of the paths the parent has.
    listed = clone.run("ls-tree", "-z", "--full-tree", change.parent, "--", *wanted)
    blobs: dict[str, str] = {}
    for entry in filter(None, listed.split("\0")):
        info, _, path = entry.partition("\t")
        _mode, kind, sha = info.split()
        if kind == "blob":
            blobs[path] = sha

    def fill(staging: Path) -> None:
        for path, sha in blobs.items():
            target = staging / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(clone.blob(sha))
        # A partial copy made here: an empty list, so that no file is taken
        # as absent from the commit (engine/tree.py; a folder without the
        # list is read as a whole tree).
        (staging / ASKED_FOR).write_text("")

    return write_once(out, fill, f"the files of commit {change.parent[:12]}")


def imported_module_files(text: str, path: str) -> set[str]:
    """The files that may hold the ``vllm`` modules the file ``path``
    imports from (``vllm/a.py`` or ``vllm/a/__init__.py``; for ``from
    vllm.a import b`` also ``b`` as a submodule)."""
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    package = path.split("/")[:-1]
    modules: list[list[str]] = []
    for node in ast.walk(tree):
        match node:
            case ast.ImportFrom(module=name, names=aliases, level=level):
                base = package[: len(package) - level + 1] if level else []
                parts = [*base, *(name.split(".") if name else [])]
                modules.append(parts)
                modules.extend([*parts, alias.name] for alias in aliases)
            case ast.Import(names=aliases):
                modules.extend(alias.name.split(".") for alias in aliases)
    return {
        f"{'/'.join(parts)}{suffix}"
        for parts in modules
        if parts[:1] == ["vllm"] and "*" not in parts
        for suffix in (".py", "/__init__.py")
    }


def _text_at(clone: Clone, commit: str, path: str) -> str:
    """The file at ``path`` in ``commit``; "" where it has none."""
    try:
        return clone.blob(f"{commit}:{path}").decode("utf-8", errors="replace")
    except DeepstackError:  # deleted by the commit: derive refuses it anyway
        return ""


def _pull_request_id(change: CommitChange) -> str:
    if change.pull_request is None:
        raise DeepstackError(
            f"--commit {change.short}: its subject names no pull request "
            f"(no '(#N)' at its end): {change.subject!r}",
            "pass --id ID (e.g. --id acme#12), or give the commit upstream "
            "merged the pull request as",
        )
    return f"vllm#{change.pull_request}"


def _git_failed(where: Path, exc: git.GitCommandError) -> DeepstackError:
    stderr = str(exc.stderr).strip().removeprefix("stderr:").strip(" '\n")
    if "dubious ownership" in stderr:
        return DeepstackError(
            f"git refuses the repository at {where}: it is owned by another "
            "user (git's 'dubious ownership' check)",
            f"if you trust it: git config --global --add safe.directory {where}",
        )
    return DeepstackError(
        f"git failed in {where}: {stderr or exc}",
        "check that --repo is a clone git can read",
    )

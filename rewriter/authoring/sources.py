"""Where ``derive`` reads a fix from: a diff file and the base it applies to.

The base is a release (only the diff's files, extracted once into the
cache), a tree on disk (``--base-src``), or, in ``commit``, a commit's
parent in a git object store. Whatever the base, it has a version: the data
file records it, and every table shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.tree import VllmTree

if TYPE_CHECKING:
    from deepstack_patch.engine.derived import DerivedPatch


def read_diff(diff: Path) -> str:
    try:
        return diff.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DeepstackError(
            f"--diff {diff}: no such file",
            "save the PR's diff first (https://github.com/OWNER/REPO/pull/N.diff)",
        ) from None
    except UnicodeDecodeError:
        raise DeepstackError(
            f"--diff {diff}: not a text file (not UTF-8)",
            "give a unified diff as git or GitHub writes it",
        ) from None
    except OSError as exc:
        raise DeepstackError(
            f"--diff {diff}: cannot read: {exc.strerror}",
            "give the file that holds the diff",
        ) from None


def mail_subject(diff_text: str) -> str:
    """The subject of the first mail of a ``git format-patch`` text, without
    its ``[PATCH n/m]``; "" for a diff that is not a mail."""
    import email.parser
    import email.policy
    import re

    match = re.match(r"From [0-9a-f]{40} ", diff_text)
    if match is None:
        return ""
    header_block = re.split(r"\r?\n\r?\n", diff_text, maxsplit=1)[0]
    header_block = header_block.split("\n", 1)[-1]
    parsed = email.parser.HeaderParser(policy=email.policy.default).parsestr(
        header_block
    )
    subject = " ".join(str(parsed.get("Subject", "")).split())
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)


def pull_request_of(subject: str) -> int | None:
    """The pull request a subject names, upstream's way of squash-merging
    one (``... (#43161)``); None where it names none."""
    import re

    match = re.search(r"\(#(\d+)\)\s*$", subject)
    return int(match.group(1)) if match else None


def id_of_mail(subject: str, diff: Path) -> str:
    """The id a ``git format-patch`` mail's subject names (``vllm#N``, as
    ``--commit`` takes it), for a ``--diff`` without ``--id``."""
    number = pull_request_of(subject)
    if number is None:
        what = (
            f"its subject names no pull request (no '(#N)' at its end): {subject!r}"
            if subject
            else "it is no git format-patch mail, whose subject could name one"
        )
        raise DeepstackError(
            f"--diff {diff} needs --id ID: {what}",
            "e.g. --id vllm#49397, --id acme#12 or --id local#F1",
        )
    return f"vllm#{number}"


def check_version(version: str, option: str = "--base-version") -> str:
    """A version given by hand: it goes into the data file and every table
    (checked as the loader checks the file's versions)."""
    from deepstack_patch.engine.derived.data import version_problem

    if not version or version_problem(version):
        raise DeepstackError(
            f"{option} {version!r}: not a version",
            f"the vLLM release the base is, e.g. {option} 0.20.2",
        )
    return version


def source_base(base_src: Path, tree_version: str | None) -> VllmTree:
    """The ``--base-src`` tree, with a version: its own or ``--base-version``."""
    import dataclasses

    try:
        base = VllmTree.open(base_src)
    except DeepstackError as exc:  # worded for --vllm-src, the usual option
        exc.message = exc.message.replace("--vllm-src", "--base-src", 1)
        raise
    if tree_version is not None:
        version = check_version(tree_version)
        return dataclasses.replace(
            base, version=version, version_source="--base-version"
        )
    if base.version_source == "unknown":
        raise DeepstackError(
            f"--base-src {base_src}: the tree has no version (no PKG-INFO, "
            "vllm/_version.py or git tag), which the data file records as its base",
            "pass --base-version VERSION: the vLLM release the tree is, or the "
            "last release before it (e.g. --base-version 0.20.2)",
        )
    return base


def release_base(
    version: str, paths: list[str], note: Callable[[str], None] | None
) -> tuple[VllmTree, Callable[[DerivedPatch], VllmTree]]:
    """The diff's files of a release, extracted once into the cache; and the
    tree to check the derived patch on: one that also holds the modules its
    fix reads, so that a name the release lacks is found lacking."""
    from deepstack_patch.distribution.matrix import status_tree
    from deepstack_patch.fetch.releases import release_archive

    archive = release_archive(version, None, note)

    def checked_on(patch: DerivedPatch) -> VllmTree:
        wanted = sorted({*paths, *patch.also_reads})
        return status_tree(archive, version, wanted)

    return status_tree(archive, version, sorted(set(paths))), checked_on


def check_sources(
    *,
    diff: Path | None,
    commit: str | None,
    repo: Path | None,
    release: str | None,
    base_src: Path | None,
    tree_version: str | None,
    patch_id: str | None,
) -> None:
    """One source of the fix: ``--diff`` with its base, or ``--commit``
    (``patch_id`` or the subject of either names the id)."""
    if commit is not None:
        given = [
            option
            for option, value in (
                ("--diff", diff),
                ("--base", release),
                ("--base-src", base_src),
            )
            if value is not None
        ]
        if given:
            raise DeepstackError(
                f"--commit and {', '.join(given)} exclude each other: the commit "
                "is the diff, and its parent the base",
                "give --commit SHA [--repo PATH], or --diff FILE with --base or "
                "--base-src",
            )
        return
    if repo is not None:
        raise DeepstackError(
            "--repo goes with --commit: it is the clone the commit is read from",
            "add --commit SHA, or leave out --repo",
        )
    if diff is None:
        raise DeepstackError(
            "give the fix: --diff FILE (with --base or --base-src), or --commit SHA",
            "e.g. --commit 1a2b3c4 --repo ~/src/vllm, or --diff 49397.diff "
            "--base 0.27.1 --id vllm#49397",
        )

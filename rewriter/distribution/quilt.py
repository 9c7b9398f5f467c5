"""A plan split patch by patch, and written as a quilt / git format-patch series.

Vendors take fixes as one commit or one patch file per upstream fix, so the
plan of the whole series is replayed patch by patch: step N holds the change
from the tree after steps 1..N-1 to the tree after step N. Everything is
computed in memory, before anything is written; the steps together must give
exactly the bytes of the whole plan, or nothing is done.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deepstack_patch import __version__
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import FileEdit, Plan, plan_tree
from deepstack_patch.engine.protocol import Patch, PatchReport, PatchState
from deepstack_patch.engine.recognition_cache import RecognitionCache
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.output.diffs import unified_diff
from deepstack_patch.output.upstream import origin_words, upstream_commit

#: The first line of every series file this tool writes; a folder whose
#: series starts with it may be rewritten by a later export.
SERIES_MARKER = "# deepstack-patch series"


@dataclass
class PatchStep:
    """One needed patch and the edits it makes on top of the steps before it."""

    patch: Patch
    edits: list[FileEdit]
    #: The parts of it this release never had, left out where the others go
    #: in (engine/whole.py): ``label: reason``.
    left_out: list[str] = field(default_factory=list)


def plan_steps(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    progress: Callable[[str], None] | None = None,
    cache: RecognitionCache | None = None,
) -> tuple[Plan, list[PatchStep]]:
    """The plan of the whole selection, and its per-patch steps in series order.

    Each step is cut from the stages the plan kept of every file (the file as
    each patch left it, each rewrite checked on its predecessors' output as
    the plan made it), so the series is planned once. When the plan has a
    drifted patch the steps are empty: callers refuse.
    """
    full = plan_tree(tree, series, selected, progress=progress, cache=cache)
    return full, steps_of(full, series)


def steps_of(full: Plan, series: Sequence[Patch]) -> list[PatchStep]:
    """:func:`plan_steps`'s steps, of a plan made already."""
    if any(r.selected and r.state.value == "drifted" for r in full.reports):
        return []
    edits_of: dict[str, list[FileEdit]] = {}
    for edit in full.edits:
        before = edit.old
        for index, (patch_id, after) in enumerate(edit.stages):
            # A file added is created by its first stage, a file deleted
            # removed by its last; the stages between change it.
            action = (
                "add"
                if edit.action == "add" and index == 0
                else "delete"
                if edit.action == "delete" and index == len(edit.stages) - 1
                else "change"
            )
            if after != before or action != "change":
                edits_of.setdefault(patch_id, []).append(
                    FileEdit(edit.relpath, before, after, [patch_id], action=action)
                )
            before = after
        if before != edit.new:
            raise DeepstackError(
                f"{edit.relpath}: the patches' stages do not end in the file the "
                "series writes",
                "report it with `deepstack-patch status --format json`",
            )
    reports = {report.patch.id: report for report in full.reports}
    return [
        PatchStep(p, edits_of[p.id], _left_out(reports[p.id]))
        for p in series
        if p.id in edits_of
    ]


def _left_out(report: PatchReport) -> list[str]:
    """The parts of a written patch that are not applicable: what a step's
    description says it leaves out, and why (``not in this release: ...``)."""
    found = []
    for part in report.patch.parts:
        state, reason = report.part_state(part)
        if state is PatchState.NOT_APPLICABLE:
            label = report.patch.part_label(part).partition("::")[2] or part
            found.append(f"{label}: {reason}")
    return found


def upstream_reference(patch: Patch) -> str:
    """``vllm-project/vllm#12345`` for a GitHub pull request URL, else the id."""
    match = re.search(r"github\.com/([^/]+/[^/]+)/pull/(\d+)", patch.upstream_url)
    return f"{match.group(1)}#{match.group(2)}" if match else patch.id


def build_date() -> dt.datetime:
    """Now, or ``SOURCE_DATE_EPOCH`` so that rebuilt series are byte-identical."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        try:
            return dt.datetime.fromtimestamp(int(epoch), tz=dt.timezone.utc)
        except ValueError:
            raise DeepstackError(
                f"SOURCE_DATE_EPOCH={epoch!r} is not a number of seconds",
                "unset it, or set it to e.g. $(git log -1 --format=%ct)",
            ) from None
    return dt.datetime.now(tz=dt.timezone.utc).replace(microsecond=0)


def patch_filename(number: int, patch: Patch) -> str:
    """``0001-vllm-12345-model-fix-...patch``, as format-patch names."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{patch.id} {patch.title}".lower()).strip("-")
    return f"{number:04d}-{slug[:52].rstrip('-')}.patch"


def _folded(text: str) -> str:
    """An RFC 822 continuation block: one space in front, ``.`` for blank lines."""
    lines = [line.strip() for line in text.strip().splitlines()]
    return "\n".join(f" {line}" if line else " ." for line in lines)


def _diffstat(edits: Sequence[FileEdit], diff: str) -> str:
    counts: dict[str, list[int]] = {edit.relpath: [0, 0] for edit in edits}
    path = ""
    for line in diff.splitlines():
        if line.startswith("diff --git a/"):
            path = line.split(" b/", 1)[1]
        elif line.startswith("+") and not line.startswith("+++ "):
            counts[path][0] += 1
        elif line.startswith("-") and not line.startswith("--- "):
            counts[path][1] += 1
    width = max(len(p) for p in counts)
    rows = [
        f" {path.ljust(width)} | {a + d} {'+' * a}{'-' * d}"
        for path, (a, d) in counts.items()
    ]
    added = sum(a for a, _ in counts.values())
    removed = sum(d for _, d in counts.values())
    files = len(counts)
    rows.append(
        f" {files} file{'s' if files != 1 else ''} changed, "
        f"{added} insertion{'s' if added != 1 else ''}(+), "
        f"{removed} deletion{'s' if removed != 1 else ''}(-)"
    )
    return "\n".join(rows)


def vllm_named(tree_version: str) -> str:
    """``vLLM 0.20.2``; a tree without version metadata is named as such."""
    if tree_version == "unknown":
        return "an unversioned vLLM tree"
    return f"vLLM {tree_version}"


def format_patch(
    step: PatchStep, number: int, total: int, tree_version: str, date: dt.datetime
) -> bytes:
    """One step as a ``git format-patch`` mail whose body holds DEP-3 headers.

    ``git am`` reads From/Date/Subject; ``git apply``, ``patch -p1`` and quilt
    skip everything before the first ``diff --git``.
    """
    patch = step.patch
    diff = unified_diff(step.edits)
    # The "From <hash>" line names a commit in real format-patch output; ours
    # is a digest of the diff so that different patches are told apart.
    digest = hashlib.sha1(diff.encode("utf-8", "surrogateescape")).hexdigest()
    prefix = f"[PATCH {number}/{total}]" if total > 1 else "[PATCH]"
    origin = origin_words(patch)
    description = (
        f"{patch.title}\n\n"
        + (f"{patch.symptom}\n\n" if patch.symptom else "")
        + (f"The fix was {origin}. " if origin else "")
        + f"Backported to {vllm_named(tree_version)} by deepstack-patch {__version__}, "
        f"which rewrites the code structurally (patch {patch.id}). "
        f"{patch.also_changes}"
        + "".join(f"\n\nLeft out: {part}" for part in step.left_out)
    )
    url, fixed_in, sha = patch.upstream_url, patch.fixed_in, upstream_commit(patch)
    # DEP-3's Origin names a URL, or else the commit ("commit:SHA").
    source = url or (f"commit:{sha}" if sha else "")
    header = "\n".join(
        [
            f"From {digest} Mon Sep 17 00:00:00 2001",
            "From: deepstack-patch <deepstack-patch@localhost>",
            f"Date: {email.utils.format_datetime(date)}",
            f"Subject: {prefix} {patch.title}",
            "",
            f"Description: {_folded(description).lstrip()}",
            # DEP-3 lets a patch omit Bug and Applied-Upstream, and Origin's
            # URL: a derived patch may name no pull request or release.
            f"Origin: backport, {source}" if source else "Origin: backport",
            *([f"Bug: {url}"] if url else []),
            "Forwarded: not-needed",
            *([f"Applied-Upstream: {fixed_in}"] if fixed_in else []),
            f"Last-Update: {date.date().isoformat()}",
            "",
            f"Backport-of: {upstream_reference(patch)}",
            *([f"Upstream-commit: {sha}"] if sha else []),
            *([f"Upstream-release: {fixed_in}"] if fixed_in else []),
            "---",
            _diffstat(step.edits, diff),
            "",
            "",
        ]
    )
    trailer = f"-- \ndeepstack-patch {__version__}\n\n"
    return (header + diff + trailer).encode("utf-8", "surrogateescape")


def write_series(
    directory: Path, steps: Sequence[PatchStep], tree_version: str
) -> list[str]:
    """Write one patch file per step and a quilt ``series``; return the names.

    The folder must be empty, absent, or one an earlier export wrote (its
    ``series`` starts with :data:`SERIES_MARKER`); then the files that series
    named are replaced. Other files are never touched.
    """
    series_file = directory / "series"
    old_names: list[str] = []
    if directory.exists():
        if not directory.is_dir():
            raise DeepstackError(
                f"--series {directory}: is a file",
                "give a folder for the patch files (it is created if absent)",
            )
        if any(directory.iterdir()):
            first = ""
            if series_file.is_file():
                first = series_file.read_text(errors="replace").partition("\n")[0]
            if not first.startswith(SERIES_MARKER):
                raise DeepstackError(
                    f"--series {directory}: not empty, and not a series this tool "
                    "wrote (its series file does not start with "
                    f"{SERIES_MARKER!r})",
                    "give an empty or new folder; to merge into an existing quilt "
                    "series, export to a new folder and append its series file",
                )
            old_names = [
                line.strip()
                for line in series_file.read_text().splitlines()[1:]
                if line.strip() and not line.startswith("#")
            ]
    directory.mkdir(parents=True, exist_ok=True)
    for name in old_names:
        if "/" not in name:
            (directory / name).unlink(missing_ok=True)
    date = build_date()
    names = []
    for number, step in enumerate(steps, start=1):
        name = patch_filename(number, step.patch)
        (directory / name).write_bytes(
            format_patch(step, number, len(steps), tree_version, date)
        )
        names.append(name)
    series_file.write_text(
        f"{SERIES_MARKER} for {vllm_named(tree_version)} "
        f"(deepstack-patch {__version__}); apply with quilt push -a, "
        "or each file in order with patch -p1 / git apply / git am\n"
        + "".join(f"{name}\n" for name in names)
    )
    return names


@dataclass
class ExportResult:
    """What ``export`` wrote: the plan, its steps, and the patch file names."""

    plan: Plan
    steps: list[PatchStep]
    names: list[str]

    @property
    def drifted(self) -> bool:
        return any(r.selected and r.state.value == "drifted" for r in self.plan.reports)


def export_series(
    tree: VllmTree, series: Sequence[Patch], selected: set[str], directory: Path
) -> ExportResult:
    """Write the patches ``tree`` needs as a series in ``directory``.

    A drifted selected patch writes nothing: the result says so.
    """
    plan, steps = plan_steps(tree, series, selected)
    if any(r.selected and r.state.value == "drifted" for r in plan.reports):
        return ExportResult(plan, steps, [])
    return ExportResult(plan, steps, write_series(directory, steps, tree.version))

"""Plan a series on a tree: every patch's state, and every file's new bytes.

Nothing is written here. Each candidate file is read once; its CPython ast is
built once per distinct content; the file is handed to every patch that
touches it, in series order, so a patch sees the code as the patches before it
left it. A rewrite is kept only if the patch recognises its own output as
``applied`` and the change stays inside the lines its findings claimed.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .errors import DeepstackError
from .protocol import Finding, Location, Patch, PatchReport, PatchState
from .source import SourceFile
from .tree import VllmTree


@dataclass
class FileEdit:
    """The new content of one file, with the patches that changed it."""

    relpath: str
    old: bytes
    new: bytes
    patch_ids: list[str] = field(default_factory=list)


@dataclass
class Plan:
    tree: VllmTree
    reports: list[PatchReport]
    edits: list[FileEdit]

    @property
    def drifted(self) -> list[PatchReport]:
        return [r for r in self.reports if r.state is PatchState.DRIFTED]

    @property
    def needed(self) -> list[PatchReport]:
        return [r for r in self.reports if r.selected and r.state is PatchState.NEEDED]

    def report(self, patch_id: str) -> PatchReport:
        return next(r for r in self.reports if r.patch.id == patch_id)


class RewriteRefused(Exception):
    """A patch's rewrite did not produce a shape the engine can accept."""


def select_patches(
    series: Sequence[Patch], only: Sequence[str] = (), skip: Sequence[str] = ()
) -> set[str]:
    """The ids chosen by ``--only`` and ``--skip``; unknown ids are an error."""
    known = {patch.id for patch in series}
    for patch_id in [*only, *skip]:
        if patch_id not in known:
            raise DeepstackError(
                f"unknown patch id {patch_id!r}",
                f"choose from: {', '.join(sorted(known))} (see 'deepstack-patch list')",
            )
    chosen = set(only) if only else set(known)
    return chosen - set(skip)


def plan_tree(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str] | None = None,
    *,
    rewrite: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Recognise every patch of ``series`` in ``tree`` and compute the rewrites.

    With ``rewrite=False`` (status, ``apply --check``) a patch's rewrite is
    computed only where a later patch in the same file must see its output.
    """
    if selected is None:
        selected = {patch.id for patch in series}
    reports = {p.id: PatchReport(patch=p, selected=p.id in selected) for p in series}
    # Patches often share their globs (every model file): walk each pattern once.
    globbed: dict[str, list[str]] = {}
    for pattern in dict.fromkeys(pat for p in series for pat in p.paths):
        globbed[pattern] = tree.glob((pattern,))
    files_of = {
        p.id: {rel for pattern in p.paths for rel in globbed[pattern]} for p in series
    }
    candidates = sorted(set().union(*files_of.values()))
    edits: list[FileEdit] = []
    real_dirs: dict[str, str] = {}
    for relpath in candidates:
        touching = [p for p in series if relpath in files_of[p.id]]
        raw = _read(tree, relpath)
        touching = [p for p in touching if any(m in raw for m in p.markers)]
        if not touching:
            continue
        # Only files a patch may rewrite must live inside the tree; checking
        # just these keeps a status run to one realpath per folder.
        _check_inside(tree, relpath, real_dirs)
        if progress:
            progress(relpath)
        original = SourceFile(relpath, raw)
        current = original
        changed_by: list[str] = []
        for index, patch in enumerate(touching):
            findings = patch.recognise(current.ast, relpath)
            report = reports[patch.id]
            needed = [f for f in findings if f.state is PatchState.NEEDED]
            later_in_file = any(p.id in selected for p in touching[index + 1 :])
            if needed and patch.id in selected and (rewrite or later_in_file):
                try:
                    current = _rewrite(patch, current, needed)
                    changed_by.append(patch.id)
                except RewriteRefused as refusal:
                    findings = [
                        _as_drifted(f, str(refusal)) if f in needed else f
                        for f in findings
                    ]
            report.locations.extend(Location(relpath, f) for f in findings)
        if changed_by and current.raw != original.raw:
            edits.append(FileEdit(relpath, original.raw, current.raw, changed_by))

    _block_unmet_requirements(reports, selected)
    return Plan(tree=tree, reports=list(reports.values()), edits=edits)


def _read(tree: VllmTree, relpath: str) -> bytes:
    path = tree.root / relpath
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DeepstackError(
            f"{relpath}: cannot read: no such file (a dangling symlink, or the "
            "file vanished during the run)",
            "restore the file from the release, or remove the broken link",
        ) from None
    except OSError as exc:
        raise DeepstackError(
            f"{relpath}: cannot read: {exc.strerror}",
            "check the file's permissions",
        ) from None


def _check_inside(tree: VllmTree, relpath: str, real_dirs: dict[str, str]) -> None:
    """Refuse a target that resolves outside the tree (through any symlink).

    ``real_dirs`` caches each folder's real path: a file's real path is its
    folder's real path plus its name unless the file itself is a link.
    """
    folder, _, name = relpath.rpartition("/")
    if folder not in real_dirs:
        real_dirs[folder] = os.path.realpath(tree.root / folder)
    path = os.path.join(real_dirs[folder], name)
    if os.path.islink(path):
        path = os.path.realpath(path)
    root = str(tree.root)
    if path != root and not path.startswith(root + os.sep):
        raise DeepstackError(
            f"{relpath}: is a symlink to {path}, outside the tree {root}",
            "replace the link with a copy of the file, or patch the tree it "
            "points into",
        )


def rewrite_text(patch: Patch, text: str, relpath: str = "example.py") -> str:
    """Run one patch over one piece of source, as the engine would in a tree.

    Returns the text unchanged when nothing is needed. Raises
    :class:`RewriteRefused` when the rewrite is not accepted. The example
    harness and the unit tests use this.
    """
    source = SourceFile(relpath, text.encode())
    needed = [
        f for f in patch.recognise(source.ast, relpath) if f.state is PatchState.NEEDED
    ]
    if not needed:
        return text
    return _rewrite(patch, source, needed).text


def _rewrite(patch: Patch, source: SourceFile, needed: list[Finding]) -> SourceFile:
    """Apply one patch to one file and prove the result is what it claims."""
    module = patch.rewrite(source.cst, needed)
    result = SourceFile.from_cst(source.relpath, module)
    try:
        after = patch.recognise(result.ast, source.relpath)
    except DeepstackError as exc:
        raise RewriteRefused(f"the rewrite does not parse: {exc}") from None
    for finding in needed:
        states = [
            f.state
            for f in after
            if f.symbol == finding.symbol and f.part == finding.part
        ]
        if states != [PatchState.APPLIED]:
            raise RewriteRefused(
                f"after the rewrite {finding.symbol} is "
                f"{', '.join(map(str, states)) or 'gone'}, not applied"
            )
    _check_edits_inside(source, result, needed)
    return result


def _check_edits_inside(
    before: SourceFile, after: SourceFile, needed: list[Finding]
) -> None:
    """Refuse a rewrite that touched lines no needed finding claimed."""
    old_lines = before.text.splitlines(keepends=True)
    new_lines = after.text.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        first, last = i1 + 1, max(i2, i1 + 1)
        if not any(f.span[0] <= first and last <= f.span[1] + 1 for f in needed):
            raise RewriteRefused(
                f"the rewrite changed {before.relpath}:{first}-{last}, outside "
                f"the recognised target(s) "
                + ", ".join(
                    f"{f.symbol} (lines {f.span[0]}-{f.span[1]})" for f in needed
                )
            )


def _as_drifted(finding: Finding, reason: str) -> Finding:
    return Finding(
        state=PatchState.DRIFTED,
        symbol=finding.symbol,
        line=finding.line,
        span=finding.span,
        reason=reason,
        part=finding.part,
        rewrites=finding.rewrites,
    )


def _block_unmet_requirements(
    reports: dict[str, PatchReport], selected: set[str]
) -> None:
    for report in reports.values():
        if not report.selected or report.state is not PatchState.NEEDED:
            continue
        for required in report.patch.requires:
            other = reports.get(required)
            if other and other.state is PatchState.NEEDED and not other.selected:
                report.blocked_reason = (
                    f"requires {required}, which this tree needs but which was "
                    f"not selected; drop --skip {required} or add --only {required}"
                )

"""Files a patch adds or deletes whole (a derived patch's ``new-file`` and
``deleted-file`` units), planned where the tree lacks them.

A file the tree has goes through the plan as any other (a deletion is
written in place of a rewrite: engine/plan.py). A file it lacks has no
bytes to recognise: each patch that adds or deletes it says its state
(``Patch.recognise_missing``), in series order; where one adds it, the
patches after it recognise the file as it wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from deepstack_patch.engine.context import note_source
from deepstack_patch.engine.protocol import Finding, Location, Patch, PatchState
from deepstack_patch.engine.source import SourceFile


@dataclass
class MissingFile:
    """A file the tree lacks: each patch's findings, and where one adds it,
    the file as each patch that wrote it left it (as ``FileEdit.stages``)."""

    relpath: str
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    stages: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def locations(self) -> dict[str, list[Location]]:
        """Each patch's findings, placed in the file."""
        return {
            patch_id: [Location(self.relpath, f) for f in found]
            for patch_id, found in self.findings.items()
        }

    @property
    def created(self) -> tuple[bytes, list[str], list[tuple[str, bytes]]]:
        """Its bytes once created, the patches that wrote it, its stages."""
        return self.stages[-1][1], [pid for pid, _ in self.stages], self.stages


def plan_missing_files(
    series: Sequence[Patch],
    files_of: dict[str, set[str]],
    selected: set[str],
    rewrite: bool,
) -> list[MissingFile]:
    """The files patches of ``series`` add or delete that the tree lacks
    (``files_of``: the tree's files each patch's paths match)."""
    paths = sorted(
        {
            relpath
            for patch in series
            for relpath in patch.whole_files
            if relpath not in files_of[patch.id]
        }
    )
    return [_plan(relpath, series, selected, rewrite) for relpath in paths]


def _plan(
    relpath: str, series: Sequence[Patch], selected: set[str], rewrite: bool
) -> MissingFile:
    missing = MissingFile(relpath)
    current: bytes | None = None
    for patch in series:
        if relpath not in patch.whole_files:
            continue
        if current is None:
            findings = patch.recognise_missing(relpath)
        else:
            note_source(relpath, current)
            findings = patch.recognise(SourceFile(relpath, current).ast, relpath)
        missing.findings[patch.id] = findings
        needed = any(f.state is PatchState.NEEDED for f in findings)
        if needed and patch.id in selected and rewrite:
            content = patch.whole_file(relpath)
            if content is not None:  # a file deleted where it is absent: nothing
                current = content
                missing.stages.append((patch.id, content))
    return missing

"""Apply a series to a tree: plan, then write all files or none.

The plumbing under ``deepstack-patch apply`` (without ``--commit``): the
command only chooses the mode and prints the result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from deepstack_patch.engine.plan import Plan, plan_tree
from deepstack_patch.engine.protocol import Patch, PatchReport, PatchState
from deepstack_patch.engine.transaction import tree_lock, write_edits
from deepstack_patch.engine.tree import VllmTree

#: What ``apply`` does with the plan.
WRITE, DRY_RUN, CHECK = "write", "dry-run", "check"

EXIT_OK, EXIT_NEEDED, EXIT_ERROR = 0, 1, 2


@dataclass
class ApplyResult:
    plan: Plan
    mode: str
    #: Relative paths written (empty unless the mode writes and nothing drifted).
    written: list[str] = field(default_factory=list)

    @property
    def drifted(self) -> list[PatchReport]:
        return [
            r for r in self.plan.reports if r.selected and r.state is PatchState.DRIFTED
        ]

    @property
    def exit_code(self) -> int:
        """2 drifted; with ``check``, 1 when patches are needed; else 0."""
        if self.drifted:
            return EXIT_ERROR
        if self.mode == CHECK and self.plan.needed:
            return EXIT_NEEDED
        return EXIT_OK


def apply_tree(
    tree: VllmTree, series: Sequence[Patch], selected: set[str], mode: str = WRITE
) -> ApplyResult:
    """Plan ``series`` on ``tree``; in ``write`` mode write every edit or none.

    A drifted selected patch writes nothing. ``check`` computes states only
    (no rewrites); ``dry-run`` computes the edits without writing them.
    """
    writes = mode == WRITE
    with tree_lock(tree.root) if writes else contextlib.nullcontext():
        plan = plan_tree(tree, series, selected, rewrite=mode != CHECK)
        result = ApplyResult(plan, mode)
        if writes and not result.drifted:
            result.written = write_edits(tree.root, plan.edits)
    return result

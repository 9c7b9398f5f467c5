"""Plans of pristine releases, made once per test run (issue 35).

A plan of a release depends only on the release, the patches selected and
whether it rewrites; every test that asks for the same one gets the same
object, so the whole run plans each (release, selection) once. Tests read a
plan and never change it; a test that writes takes a copy of the tree
(``patched_copy``) and writes the shared plan's edits into it: the copy has
the pristine tree's bytes, so its plan is the same plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from deepstack_patch.engine.plan import Plan, plan_tree
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import SERIES

#: Every built-in patch: a selection of ``None`` means these.
ALL = frozenset(patch.id for patch in SERIES)


class ReleasePlans:
    """``plans("0.20.2", {"vllm#40917"}, rewrite=True)``: the built-in series
    planned on a pristine release with that selection, made on first use."""

    def __init__(self, release_root: Callable[[str], Path]) -> None:
        self._release_root = release_root
        self._plans: dict[tuple[str, frozenset[str], bool], Plan] = {}

    def __call__(
        self, version: str, selected: Iterable[str] | None = None, *, rewrite=True
    ) -> Plan:
        chosen = ALL if selected is None else frozenset(selected)
        key = (version, chosen, rewrite)
        if key not in self._plans:
            tree = VllmTree.open(self._release_root(version))
            self._plans[key] = plan_tree(tree, SERIES, set(chosen), rewrite=rewrite)
        return self._plans[key]

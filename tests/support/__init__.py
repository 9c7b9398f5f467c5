"""Helpers tests share (plain functions and constants; fixtures are in conftest.py).

Import as ``from tests.support import TARGETS, link_copy``: ``tests`` is a
package, so pytest puts the repository root on ``sys.path``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.targets import load_targets
from deepstack_patch.engine.transaction import write_edits
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.patches import patch_by_id

#: targets.toml: the releases and every patch's expected state on each.
TARGETS = load_targets()


def link_copy(source: Path, destination: Path) -> Path:
    """A copy of a tree whose files are hard links to the source's files."""
    shutil.copytree(source, destination, copy_function=os.link, symlinks=True)
    return destination


def apply_one(patch_id: str, source: Path, destination: Path) -> Path:
    """A hard-link copy of ``source`` with one patch applied."""
    root = link_copy(source, destination)
    tree = VllmTree.open(root)
    write_edits(root, plan_tree(tree, [patch_by_id(patch_id)]).edits)
    return root


def run_proof(env: object, tree: Path, patch_id: str) -> tuple[str, str]:
    """``(status, message)`` of one patch's proof on ``tree`` in ``env``."""
    from deepstack_patch.proof.proofs import run_proofs

    result = run_proofs(env, tree, [patch_id])[patch_id]
    return result.status, result.message

"""Made-up derived patches and vLLM trees for the engine's tests.

A derived patch made from (path, before, after) changes, as ``derive``
makes its units; a tree of a few files, whole (with the ``pyproject.toml``
a checkout or an sdist has) or this tool's partial extraction (with its
list of what it was asked for). No vLLM code: the modules are the tests'.
"""

from __future__ import annotations

from pathlib import Path

from deepstack_patch.engine.derived import DerivedPatch
from deepstack_patch.engine.derived.units import units_of_change
from deepstack_patch.engine.tree import ASKED_FOR, VllmTree


def derived_patch(
    patch_id: str, *changes: tuple[str, str, str], requires: tuple[str, ...] = ()
) -> DerivedPatch:
    """A derived patch whose units are those of each (path, before, after)."""
    return DerivedPatch(
        id=patch_id,
        title="t",
        symptom="s",
        base="0.0.1",
        paths=sorted({path for path, _, _ in changes}),
        units=[
            unit
            for path, before, after in changes
            for unit in units_of_change(path, before, after)
        ],
        requires=requires,
    )


def toy_tree(root: Path, files: dict[str, str], *, whole: bool = True) -> VllmTree:
    """A vLLM tree of ``files``; ``whole``: with its pyproject.toml, else this
    tool's partial extraction, with its (empty, unless ``files`` gives one)
    list of what it was asked for."""
    for path, text in {
        "vllm/__init__.py": "",
        "PKG-INFO": "Metadata-Version: 2.4\nName: vllm\nVersion: 0.0.1\n",
        **({"pyproject.toml": "[project]\nname = 'vllm'\n"} if whole else {}),
        **({} if whole else {ASKED_FOR: ""}),
        **files,
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return VllmTree.open(root)


def derived_from_diff(
    root: Path, path: str, before: str, after: str, patch_id: str
) -> tuple[DerivedPatch, str, list[str]]:
    """``derive`` of the diff from ``before`` to ``after`` of ``path``, on
    this tool's partial extraction of a tree holding ``before`` (toy code:
    its runtime names are not checked); the patch, round trip and notes."""
    from deepstack_patch.authoring.derive import derive_patch_from_text

    from tests.support.upstream import git_diff

    tree = toy_tree(root, {path: before}, whole=False)
    result = derive_patch_from_text(git_diff(path, before, after), tree, patch_id)
    return result.patch, result.round_trip, result.notes

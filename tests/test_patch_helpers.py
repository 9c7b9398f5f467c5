"""The engine's helpers for patch authors: templates, findings, prose."""

from __future__ import annotations

import ast
import dataclasses

import pytest
from deepstack_patch.engine.prose import section
from deepstack_patch.engine.protocol import Finding, PatchState
from deepstack_patch.engine.syntax import finding, matches_code
from deepstack_patch.patches import SERIES

CODE = """
class Model:
    @staticmethod
    def get(self, n):  # a comment
        if n > self.buffers[0].size( 0 ):
            raise ValueError(n)

    def put(self):
        pass
"""


def test_matches_code_ignores_layout_and_fills_names() -> None:
    module = ast.parse(CODE)
    get = module.body[0].body[0]
    check = get.body[0]
    assert matches_code(check.test.comparators[0], "self.{b}[0].size(0)", b="buffers")
    assert not matches_code(check.test.comparators[0], "self.{b}[0].size(0)", b="x")
    assert matches_code(
        check, "if {n} > self.buffers[0].size(0):\n    raise ValueError({n})", n="n"
    )
    # Literal braces are doubled when names are given, as for str.format.
    braces = ast.parse('d = {"k": v}').body[0]
    assert matches_code(braces, 'd = {{"k": {value}}}', value="v")
    with pytest.raises(ValueError, match="one statement"):
        matches_code(check, "a = 1\nb = 2")


def test_finding_spans_several_nodes_from_the_first_line() -> None:
    cls = ast.parse(CODE).body[0]
    get, put = cls.body
    found = finding(PatchState.NEEDED, "Model.get", [get, put], details={"i": 1})
    # The decorator line counts; the line is the first node's.
    assert found.span == (3, 9)
    assert found.line == get.lineno == 4
    assert finding(PatchState.NEEDED, "Model.put", put).span == (8, 9)


def test_finding_details_are_read_only_and_hashable() -> None:
    details = {"index": 2}
    found = Finding(PatchState.NEEDED, "f", 1, (1, 2), details=details)
    details["index"] = 3  # the finding keeps its own copy
    assert found.details["index"] == 2
    with pytest.raises(TypeError):
        found.details["index"] = 5  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.details = {}  # type: ignore[misc]
    assert hash(found) == hash(Finding(PatchState.NEEDED, "f", 1, (1, 2)))
    assert Finding(PatchState.NEEDED, "f", 1, (1, 2)).details == {}


def test_section_joins_a_paragraph_and_prints_literals_plainly() -> None:
    doc = "Title.\n\nSymptom: a ``ValueError``\n  on padded steps\n\nWhy: more."
    assert section(doc, "Symptom") == "a `ValueError` on padded steps"
    with pytest.raises(LookupError):
        section(doc, "Fix safety")


def test_every_patch_prose_comes_from_its_docstring() -> None:
    import sys

    compared = 0
    for patch in SERIES:
        doc = sys.modules[type(patch).__module__].__doc__
        assert patch.symptom == section(doc, "Symptom"), patch.id
        assert patch.also_changes == section(doc, "Fix safety"), patch.id
        compared += 1
    assert compared == len(SERIES) > 0


def test_every_patch_package_is_installed() -> None:
    """A patch package missing from pyproject's `packages` works in a checkout
    (editable install) and is absent from the wheel."""
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    folders = {
        "deepstack_patch.patches." + init.parent.name
        for init in (root / "patches").glob("*/__init__.py")
    }
    assert folders, "no patch package found"
    assert folders <= listed, f"not in pyproject.toml: {sorted(folders - listed)}"

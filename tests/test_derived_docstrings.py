"""Docstrings a fix edits (issue 34 item 5, engine/derived/docstrings.py).

Upstream often rewords a docstring in the fix that changes its function
(vllm#52005); derive's self-check refused such fixes, since the rewrite left
the docstring as the base had it. A docstring edit is carried as text where
the target's docstring is the one the fix edits, left as it is with a note
where it is another, and never counts for recognition. A new method's
docstring keeps its indentation (vllm#52419's shape). The modules here are
made up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from deepstack_patch.engine.derived import DerivedPatch
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import Finding, PatchState

from tests.support.toys import derived_from_diff

PATH = "vllm/rope.py"

BEFORE = '''"""Rotary helpers."""


def interleave(x, sections):
    """Reorganise the layout.

    From chunked [TTT...HHH] to interleaved [THTHWH...TT].
    """
    out = x.clone()
    out[0] = x[1]
    return out


class Cache:
    """A cache."""

    def get(self, key):
        return self.store[key]

    def size(self):
        """How many.

        Counts keys.
        """
        return len(self.store)
'''

#: The fix: interleave's code and its docstring.
AFTER = BEFORE.replace("[THTHWH...TT]", "[THWTHW...TT]").replace(
    "    out[0] = x[1]\n", "    out[0] = x[1].clone()\n"
)

#: A new method, with a docstring of several lines.
NEW_METHOD = '''
    def clear(self):
        """Drop every key.

        Keeps the store itself.
        """
        self.store.clear()
'''


def derive(tmp_path: Path, before: str, after: str) -> tuple[DerivedPatch, str, list]:
    return derived_from_diff(tmp_path / "base", PATH, before, after, "local#52005")


def finding(patch: DerivedPatch, source: str) -> Finding:
    (found,) = patch.recognise(ast.parse(source), PATH)
    return found


def test_a_docstring_edited_with_the_code_is_carried_as_text(tmp_path: Path) -> None:
    patch, round_trip, notes = derive(tmp_path, BEFORE, AFTER)
    assert (round_trip, notes) == ("text", [])
    (unit,) = patch.units
    assert [edit.kind for edit in unit.edits] == ["docstring", "body"]
    assert rewrite_text(patch, BEFORE, PATH) == AFTER
    assert finding(patch, AFTER).state is PatchState.APPLIED


def test_a_docstring_that_is_another_is_left_as_it_is_with_a_note(
    tmp_path: Path,
) -> None:
    patch, _, _ = derive(tmp_path, BEFORE, AFTER)
    vendor = BEFORE.replace("Reorganise the layout.", "Reorganise (vendor's words).")
    needed = finding(patch, vendor)
    assert (needed.state, needed.reason) == (
        PatchState.NEEDED,
        "its docstring is not the one the fix edits: left as it is",
    )
    fixed = rewrite_text(patch, vendor, PATH)
    assert fixed == vendor.replace("    out[0] = x[1]\n", "    out[0] = x[1].clone()\n")
    # Docstrings never count: the fix's docstring with the old code is
    # needed, and only the code is written.
    worded = AFTER.replace("    out[0] = x[1].clone()\n", "    out[0] = x[1]\n")
    assert (finding(patch, worded).state, finding(patch, worded).reason) == (
        PatchState.NEEDED,
        "",
    )
    assert rewrite_text(patch, worded, PATH) == AFTER
    # Without a docstring, none is added: it is not the one the fix edits.
    bare = BEFORE.replace(
        '    """Reorganise the layout.\n\n'
        '    From chunked [TTT...HHH] to interleaved [THTHWH...TT].\n    """\n',
        "",
    )
    assert "Reorganise" not in rewrite_text(patch, bare, PATH)


def test_a_new_methods_docstring_keeps_its_indentation(tmp_path: Path) -> None:
    marker = "        return self.store[key]\n"
    after = BEFORE.replace(marker, marker + NEW_METHOD)
    patch, round_trip, _ = derive(tmp_path, BEFORE, after)
    assert round_trip == "text"
    assert rewrite_text(patch, BEFORE, PATH) == after


def test_a_docstring_changed_alone_is_a_unit_of_its_own(tmp_path: Path) -> None:
    """A docstring of a definition the fix does not otherwise change (a
    class's, a method's): a documentation unit carries it (issue 40 item 5,
    tests/test_derived_documentation.py), and the round trip is the text."""
    after = AFTER.replace("Counts keys.", "Counts the keys.").replace(
        '"""A cache."""', '"""A cache of keys."""'
    )
    patch, round_trip, notes = derive(tmp_path, BEFORE, after)
    assert [unit.name for unit in patch.units] == ["interleave", "Cache", "Cache.size"]
    assert [unit.documentation_only for unit in patch.units] == [False, True, True]
    assert (round_trip, notes) == ("text", [])
    assert rewrite_text(patch, BEFORE, PATH) == after


def test_the_fixed_code_with_the_old_docstring_is_needed_not_applied(
    tmp_path: Path,
) -> None:
    """A patch is never applied while one of its edits is missing (issue 40
    item 5): the code is in, the docstring the fix rewords is not; the
    rewrite writes the docstring alone."""
    patch, _, _ = derive(tmp_path, BEFORE, AFTER)
    code_only = AFTER.replace("[THWTHW...TT]", "[THTHWH...TT]")
    found = finding(patch, code_only)
    assert (found.state, found.reason) == (
        PatchState.NEEDED,
        "its code is the fixed one; its docstring is still the one the fix rewords",
    )
    assert rewrite_text(patch, code_only, PATH) == AFTER
    # Another docstring (a vendor's) is left as it is: the fix is in.
    vendor = code_only.replace("Reorganise the layout.", "Reorganise (vendor's).")
    assert finding(patch, vendor).state is PatchState.APPLIED


#: Fixes that add a docstring where there was none, and take one away.
ADDS = BEFORE.replace(
    "    def get(self, key):\n        return self.store[key]\n",
    '    def get(self, key):\n        """The value.\n\n        Of a key.\n        """\n'
    "        return self.store.get(key)\n",
)
REMOVES = BEFORE.replace(
    '        """How many.\n\n        Counts keys.\n        """\n'
    "        return len(self.store)\n",
    "        return len(self.store or ())\n",
)
#: Targets: a comment above the docstring the fix rewords; a one-line
#: function whose docstring shares its header's line; a comment between a
#: header and the statement under which a docstring is added.
COMMENTED = BEFORE.replace(
    '    """Reorganise the layout.',
    '    # the layouts are documented\n    """Reorganise the layout.',
)
ONE_LINE = BEFORE.replace(
    "    def get(self, key):\n", "    def get(self, key):  # fast\n"
)
LED = BEFORE.replace(
    "    def get(self, key):\n", "    def get(self, key):\n        # a plain read\n"
)


@pytest.mark.parametrize(
    ("after", "target", "on_text"),
    [
        (AFTER, BEFORE, True),
        (AFTER, COMMENTED, True),
        (ADDS, BEFORE, True),
        (ADDS, ONE_LINE, True),
        (ADDS, LED, False),  # the module puts it above the comment
        (REMOVES, BEFORE, True),
    ],
    ids=[
        "replaced",
        "under-a-comment",
        "added",
        "added-header-comment",
        "added-under-a-comment",
        "removed",
    ],
)
def test_a_docstring_is_written_on_text_as_the_module_writes_it(
    tmp_path: Path, after: str, target: str, on_text: bool
) -> None:
    """A docstring edit is made on the file's text (no LibCST module parsed
    and printed, a first status's cost), to the byte what the module's
    rewrite writes; where the text cannot tell it so (lines above a
    docstring it adds), the module's rewrite runs."""
    import libcst

    patch, _, _ = derive(tmp_path, BEFORE, after)
    needed = [
        f
        for f in patch.recognise(ast.parse(target), PATH)
        if f.state is PatchState.NEEDED
    ]
    assert needed
    by_module = patch.rewrite(libcst.parse_module(target), needed).code
    by_text = patch.rewrite_text(target.encode(), needed)
    assert (by_text is not None) == on_text
    if by_text is not None:
        assert by_text.decode() == by_module
    assert rewrite_text(patch, target, PATH) == by_module

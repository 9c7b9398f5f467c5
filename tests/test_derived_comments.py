"""Comment lines a fix edits (issue 40 item 5, engine/derived/comments.py).

The maintainers' backports carry the comments upstream rewrote beside its
code: above an ``if`` whose body the fix changes (vllm#43846), above a call
it keeps (vllm#40960 deletes one), above a module statement it keeps
(vllm#41006). Comments never reach the ``ast``; derive recorded none of
these, so the rewrite left the old words and the round trip said ``ast``.
Now a run of comment lines between two statements the fix keeps is an edit
of its own, carried where the target's lines are the old ones exactly, and
left as they are anywhere else (a vendor's comment is theirs). The modules
here are made up.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from deepstack_patch.engine.derived import DerivedPatch, load_derived, rewrite
from deepstack_patch.engine.derived.data import dump_derived
from deepstack_patch.engine.derived.match import CompiledEdit
from deepstack_patch.engine.derived.truth import disagreement
from deepstack_patch.engine.derived.units import units_of_change
from deepstack_patch.engine.errors import DeepstackError, RewriteRefused
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import Finding, PatchState
from deepstack_patch.engine.source import SourceFile

from tests.support.toys import derived_from_diff

PATH = "vllm/limits.py"

BEFORE = '''"""Limits for a made-up scheduler."""
import os

# Tokens per step; the old rule.
LIMIT = 4


class Budget:
    # Shared by every request.
    size = 8

    def take(self, n):
        self.n = n
        # Case 3: no budget at all, raise.
        if n > self.size:
            raise ValueError("over budget")
        # Create the record.
        record = dict(n=n)
        return record
'''

#: The fix: ``take`` returns instead of raising; the comments beside it,
#: and two elsewhere, say so.
AFTER = (
    BEFORE.replace(
        "# Tokens per step; the old rule.",
        "# Tokens per step.\n# The scheduler may lower it.",
    )
    .replace("# Shared by every request.", "# Shared by all requests.")
    .replace(
        "# Case 3: no budget at all, raise.", "# Case 3: no budget, nothing to take."
    )
    .replace('raise ValueError("over budget")', "return None")
    .replace("        # Create the record.\n", "")
)


def derive(tmp_path: Path, before: str, after: str) -> tuple[DerivedPatch, str, list]:
    return derived_from_diff(tmp_path / "base", PATH, before, after, "local#43846")


def findings(patch: DerivedPatch, source: str) -> dict[str, Finding]:
    """Each unit's finding, on a module parsed as the engine parses a file
    (its comment lines can be read back from it)."""
    tree = SourceFile(PATH, source.encode()).ast
    return {f.symbol: f for f in patch.recognise(tree, PATH)}


def test_comment_lines_the_fix_edits_are_units_or_ride_along(tmp_path: Path) -> None:
    patch, round_trip, notes = derive(tmp_path, BEFORE, AFTER)
    assert (round_trip, notes) == ("text", [])
    units = {unit.name: unit for unit in patch.units}
    assert list(units) == [
        "comments above LIMIT",
        "Budget.comments above size",
        "Budget.take",
    ]
    assert [u.documentation_only for u in units.values()] == [True, True, False]
    # The method's comment lines ride along with its code: one above the
    # `if` whose body changes, one deleted above a call it keeps.
    take = units["Budget.take"]
    assert [edit.kind for edit in take.edits] == ["comments", "body", "comments"]
    deleted = take.edits[2]
    assert (deleted.removed, deleted.inserted) == ("# Create the record.\n", "")
    assert deleted.after_anchor is not None
    assert deleted.after_anchor.code == "record = dict(n=n)"
    assert rewrite_text(patch, BEFORE, PATH) == AFTER
    assert {f.state for f in findings(patch, AFTER).values()} == {PatchState.APPLIED}


def test_comment_lines_are_carried_only_where_the_old_ones_are(
    tmp_path: Path,
) -> None:
    """A vendor's comment is theirs: left as it is, with the reason, and the
    fix's code still goes in; elsewhere upstream's lines are written, and
    not one byte else."""
    patch, _, _ = derive(tmp_path, BEFORE, AFTER)
    vendor = BEFORE.replace(
        "# Tokens per step; the old rule.", "# Tokens per step (vendor: 6)."
    ).replace("# Case 3: no budget at all, raise.", "# vendor: keep raising?")
    found = findings(patch, vendor)
    left_out = found["comments above LIMIT"]
    assert left_out.state is PatchState.NOT_APPLICABLE
    assert left_out.reason == (
        "left out: the comments above `LIMIT = 4` in the module are neither the "
        "ones the fix edits nor the fixed ones"
    )
    take = found["Budget.take"]
    assert take.state is PatchState.NEEDED
    assert take.reason == (
        "its comments above `if n > self.size:` are not the ones the fix "
        "edits: left as they are"
    )
    written = rewrite_text(patch, vendor, PATH)
    assert written == (
        AFTER.replace(
            "# Tokens per step.\n# The scheduler may lower it.",
            "# Tokens per step (vendor: 6).",
        ).replace("# Case 3: no budget, nothing to take.", "# vendor: keep raising?")
    )


def test_the_fixed_code_with_the_old_comments_is_needed_not_applied(
    tmp_path: Path,
) -> None:
    """A patch is never applied while one of its edits is missing: the code
    is in, a comment the fix rewords beside it is not; the rewrite writes
    the comment lines alone."""
    patch, _, _ = derive(tmp_path, BEFORE, AFTER)
    code_only = AFTER.replace(
        "# Case 3: no budget, nothing to take.", "# Case 3: no budget at all, raise."
    )
    take = findings(patch, code_only)["Budget.take"]
    assert (take.state, take.reason) == (
        PatchState.NEEDED,
        "its code is the fixed one; its comment lines are still the ones the "
        "fix rewords",
    )
    assert rewrite_text(patch, code_only, PATH) == AFTER


def test_a_diff_of_comment_lines_alone_derives(tmp_path: Path) -> None:
    """A fix whose only change in a file is comment lines (a docs fix)
    derives documentation units alone, which decide by themselves."""
    after = BEFORE.replace("# Shared by every request.", "# Shared by all requests.")
    patch, round_trip, _ = derive(tmp_path, BEFORE, after)
    assert [u.name for u in patch.units] == ["Budget.comments above size"]
    assert round_trip == "text"
    assert findings(patch, BEFORE)["Budget.comments above size"].state is (
        PatchState.NEEDED
    )
    assert rewrite_text(patch, BEFORE, PATH) == after


def test_a_data_file_from_before_comment_edits_still_loads(tmp_path: Path) -> None:
    """A function's unit written before comment lines were edits has none:
    still one truth. A comment edit's words are compared as text: a
    hand-edited one is refused (as code, any two comments are the same)."""
    (take,) = [
        u for u in units_of_change(PATH, BEFORE, AFTER) if u.name == "Budget.take"
    ]
    older = dataclasses.replace(
        take, edits=tuple(e for e in take.edits if e.kind != "comments")
    )
    assert disagreement(older) == ""
    edited = dataclasses.replace(
        take,
        edits=(
            dataclasses.replace(take.edits[0], inserted="# Case 3: my own words.\n"),
            *take.edits[1:],
        ),
    )
    assert "`inserted` has `# Case 3: my own words.`" in disagreement(edited)


def test_a_comments_edit_names_the_statement_it_is_above(tmp_path: Path) -> None:
    patch, _, _ = derive(tmp_path, BEFORE, AFTER)
    text = dump_derived(patch)
    anchor = 'after_anchor = {code = "LIMIT = 4", match = "statement"}\n'
    assert text.count(anchor) == 1
    broken = tmp_path / "broken.toml"
    broken.write_text(text.replace(anchor, ""))
    with pytest.raises(DeepstackError, match="a comments edit needs an after_anchor"):
        load_derived(broken)


def test_blank_lines_alone_are_formatting_not_an_edit() -> None:
    """Blank lines added between statements, in a class the fix changes
    and in one it does not, are no edit."""
    spaced = BEFORE.replace("    size = 8\n", "    size = 8\n\n")
    assert units_of_change(PATH, BEFORE, spaced) == []
    fixed_and_spaced = AFTER.replace("    size = 8\n", "    size = 8\n\n")
    assert units_of_change(PATH, BEFORE, fixed_and_spaced) == units_of_change(
        PATH, BEFORE, AFTER
    )


def test_the_rewrite_writes_no_comment_over_lines_it_was_not_shown() -> None:
    """The rewrite checks the lines again: where they are no longer the old
    ones (the file changed after recognition), it refuses, never overwrites."""
    (take,) = [
        u for u in units_of_change(PATH, BEFORE, AFTER) if u.name == "Budget.take"
    ]
    compiled = CompiledEdit.of(take.edits[0])
    vendor = BEFORE.replace("# Case 3: no budget at all, raise.", "# vendor's")
    with pytest.raises(RewriteRefused, match="not the ones the fix edits"):
        rewrite.edited_code(
            vendor, "\n", [(take, [(compiled, {"comments": "replace"})], {})]
        )

"""Derived patches on the shapes real fixes have: a block whose body starts
with a comment, a fix that changes only an ``if``'s (``elif``, ``while``,
``for``, ``with``) header, a statement or block header that is there more
than once; and ``derive`` never ends in a traceback, whatever the diff.

Small synthetic modules only (no vLLM code).
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest
from deepstack_patch.engine.derived import load_derived, shapes
from deepstack_patch.engine.derived.data import dump_derived
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import PatchState

from tests.test_derive import PATH, _tree, derive_args, derived, git_diff, run, states

# -- a body that starts with a comment ----------------------------------------

COMMENT_FIRST = (
    "class Config:\n"
    "    def __post_init__(self):\n"
    "        # Keep the name before the redirect\n"
    "        self.name = self.model\n"
    "        return self.name\n"
)


@pytest.mark.parametrize(
    "before",
    [
        COMMENT_FIRST,
        # The comment after the colon, on the header's line.
        COMMENT_FIRST.replace(
            "(self):\n        # Keep the name before the redirect\n",
            "(self):  # noqa: C901\n",
        ),
        # A header the fix changes, over a body that starts with a comment.
        COMMENT_FIRST.replace("return self.name", "return None"),
    ],
    ids=["comment-line", "comment-on-header", "header-change"],
)
def test_a_body_starting_with_a_comment_is_derived(tmp_path: Path, before: str) -> None:
    after = before.replace("return self.name", "return self.name.strip()")
    if "return None" in before:
        after = before.replace("(self):", "(self, strict=False):")
    # ``self.name.strip``: no toy package reads ``strip``; not what is tested.
    root = _tree(tmp_path / "base", {PATH: before}, partial=True).root
    diff = tmp_path / "fix.diff"
    diff.write_text(git_diff(PATH, before, after))
    code, output = run(*derive_args(diff, root, tmp_path / "out"))
    assert code == 0, output
    patch = load_derived(tmp_path / "out" / "local-F1.toml")
    for edit in patch.units[0].edits:  # the comment is the body's, not the header's
        assert "#" not in edit.header_before.split(":")[-1]
    assert rewrite_text(patch, before, PATH) == after


# -- a compound statement whose header alone changes ---------------------------

IF_BEFORE = (
    "def load(self, x):\n"
    "    a = 1\n"
    "    if x is None:\n"
    "        x = default()\n"
    "        log(x)\n"
    "    return x\n"
)
IF_AFTER = IF_BEFORE.replace("if x is None:", "if x is None or not x:")
#: A vendor's (or another release's) body of the same `if`.
IF_VENDOR = IF_BEFORE.replace(
    "        log(x)\n", "        # ours\n        warn(x, 2)\n"
)


def test_an_if_condition_alone_is_carried_over_a_body_that_differs() -> None:
    patch = derived(IF_BEFORE, IF_AFTER)
    [unit] = patch.units
    assert [(e.kind, e.header_before, e.header_after) for e in unit.edits] == [
        ("header", "if x is None:\n", "if x is None or not x:\n")
    ]
    assert states(patch, IF_VENDOR)["load"] == (PatchState.NEEDED, "")
    fixed = rewrite_text(patch, IF_VENDOR, PATH)
    assert fixed == IF_VENDOR.replace("if x is None:", "if x is None or not x:")
    assert states(patch, fixed)["load"] == (PatchState.APPLIED, "")
    assert rewrite_text(patch, fixed, PATH) == fixed
    other = IF_VENDOR.replace("if x is None:", "if x == 0:")
    state, reason = states(patch, other)["load"]
    assert state is PatchState.DRIFTED and "`if x is None:` not found" in reason


@pytest.mark.parametrize(
    ("before", "old", "new"),
    [
        (
            "def f(x):\n    if x == 1:\n        a = 1\n    elif x == 2:\n"
            "        a = 2\n    else:\n        a = 3\n    return a\n",
            "elif x == 2:",
            "elif x in (2, 4):",
        ),
        (
            "def f(x):\n    while x > 0:\n        x -= 1\n    return x\n",
            "while x > 0:",
            "while x > 1:",
        ),
        (
            "async def f(xs):\n    async for x in xs:\n        use(x)\n"
            "    else:\n        done()\n",
            "async for x in xs:",
            "async for x in xs[1:]:",
        ),
        (
            "from locks import lock, other\n\n\n"
            "class A:\n    def f(self):\n        with lock(1) as held:\n"
            "            use(held)\n        return 0\n",
            "with lock(1) as held:",
            "with lock(2) as held, other():",
        ),
        (
            "import os\n\nCYGWIN = False\nif os.name == 'nt':\n"
            "    SEP = '\\\\'\nelse:\n    SEP = '/'\n",
            "if os.name == 'nt':",
            "if (\n    os.name == 'nt'\n    and not CYGWIN\n):",
        ),
    ],
    ids=["elif", "while", "async-for-else", "with", "module-if"],
)
def test_the_header_of_elif_while_for_with_is_carried_alone(
    before: str, old: str, new: str
) -> None:
    after = before.replace(old, new)
    patch = derived(before, after)
    assert [e.kind for u in patch.units for e in u.edits] == ["header"]
    # The block under the header differs in the target: it stays the target's.
    lines = before.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if old.split("\n")[0] in line)
    indent = len(lines[at + 1]) - len(lines[at + 1].lstrip())
    target = "".join([*lines[: at + 1], " " * indent + "extra = 1\n", *lines[at + 1 :]])
    assert {s for s, _ in states(patch, target).values()} == {PatchState.NEEDED}
    fixed = rewrite_text(patch, target, PATH)
    expected = "".join(
        [*after.splitlines(keepends=True)][: at + 1 + new.count("\n")]
        + [" " * indent + "extra = 1\n"]
        + after.splitlines(keepends=True)[at + 1 + new.count("\n") :]
    )
    assert fixed == expected
    assert {s for s, _ in states(patch, fixed).values()} == {PatchState.APPLIED}
    assert rewrite_text(patch, fixed, PATH) == fixed


def test_two_headers_changed_side_by_side_are_two_header_edits() -> None:
    before = "def f(x):\n    if x:\n        a = 1\n    if a:\n        b = 1\n"
    after = "def f(x):\n    if x > 0:\n        a = 1\n    if a > 0:\n        b = 1\n"
    patch = derived(before, after)
    assert [e.kind for e in patch.units[0].edits] == ["header", "header"]
    assert rewrite_text(patch, before, PATH) == after
    assert states(patch, after)["f"] == (PatchState.APPLIED, "")
    half = before.replace("if x:", "if x > 0:")
    assert states(patch, half)["f"][0] is PatchState.DRIFTED


# -- a statement or block header found more than once --------------------------

TWICE_BEFORE = (
    "class Attention:\n"
    "    def __init__(self, q_lora_rank):\n"
    "        self.q_lora_rank = q_lora_rank\n"
    "        if self.q_lora_rank is not None:\n"
    "            self.q_a = make(1)\n"
    "        self.kv = make(2)\n"
    "        if self.q_lora_rank is not None:\n"
    "            self.q_b = make(3)\n"
    "        else:\n"
    "            self.q = make(4)\n"
    "        self.o = make(5)\n"
)
TWICE_AFTER = TWICE_BEFORE.replace("make(3)", "make(3, bias=False)")


def test_a_block_header_found_twice_is_told_apart_by_its_neighbours(
    tmp_path: Path,
) -> None:
    patch = derived(TWICE_BEFORE, TWICE_AFTER)
    [edit] = patch.units[0].edits
    step = edit.block[-1]
    assert step.header == "if self.q_lora_rank is not None:\n    ...\nelse:\n    ..."
    assert step.before is not None and step.before.code == "self.kv = make(2)"
    assert step.after is not None and step.after.code == "self.o = make(5)"
    assert states(patch, TWICE_BEFORE)["Attention.__init__"][0] is PatchState.NEEDED
    assert rewrite_text(patch, TWICE_BEFORE, PATH) == TWICE_AFTER
    assert states(patch, TWICE_AFTER)["Attention.__init__"][0] is PatchState.APPLIED
    # The neighbours are in the data file, and read back.
    data = tmp_path / "p.toml"
    data.write_text(dump_derived(patch))
    assert load_derived(data).units[0].edits[0].block[-1] == step
    # A file without them (as written before they were recorded) still loads.
    recorded = data.read_text()
    old = re.sub(r', (before|after) = \{code = "[^"]*", match = "\w+"\}', "", recorded)
    assert old != recorded
    data.write_text(old)
    assert load_derived(data).units[0].edits[0].block[-1].before is None
    # Where the neighbours do not single out one, it drifts.
    both = TWICE_BEFORE + (
        "        self.kv = make(2)\n"
        "        if self.q_lora_rank is not None:\n"
        "            self.q_b = make(3)\n"
        "        else:\n"
        "            self.q = make(4)\n"
        "        self.o = make(5)\n"
    )
    state, reason = states(patch, both)["Attention.__init__"]
    assert state is PatchState.DRIFTED
    assert "found 3 times, 2 of them between its neighbours" in reason


def test_a_statement_to_replace_found_twice_is_told_apart_by_its_neighbours() -> None:
    before = "def f(x):\n    x = 1\n    y = 2\n    x = 1\n    return x\n"
    after = "def f(x):\n    x = 1\n    y = 2\n    x = 3\n    return x\n"
    patch = derived(before, after)
    assert states(patch, before)["f"] == (PatchState.NEEDED, "")
    assert rewrite_text(patch, before, PATH) == after
    assert states(patch, after)["f"] == (PatchState.APPLIED, "")
    # A vendor's line between: the neighbours no longer single it out.
    vendor = before.replace("    x = 1\n    return", "    x = 1\n    z = 0\n    return")
    state, reason = states(patch, vendor)["f"]
    assert state is PatchState.DRIFTED and "`x = 1` found 2 times" in reason


# -- never a traceback ----------------------------------------------------------


def test_an_unforeseen_error_is_an_error_and_a_hint_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last guard: an exception inside derive's analysis is said as
    ``error:``/``hint:`` (exit 2, nothing written), never a traceback."""
    from deepstack_patch.engine import derived
    from deepstack_patch.engine.derived import units as derived_units

    before, after = IF_BEFORE, IF_AFTER
    root = _tree(tmp_path / "base", {PATH: before}).root
    diff = tmp_path / "fix.diff"
    diff.write_text(git_diff(PATH, before, after))

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("made up")

    for owner, name, named in (
        (derived_units, "units_of_change", f"reading the change of {PATH}"),
        (derived.DerivedPatch, "recognise", f"checking function load in {PATH}"),
    ):
        with monkeypatch.context() as patched:
            patched.setattr(owner, name, broken)
            out = tmp_path / name
            code, output = run(*derive_args(diff, root, out))
        assert code == 2, output
        assert f"derive failed {named}: RuntimeError: made up" in output
        assert "hint:" in output and "Traceback" not in output
        assert not out.exists()


#: The files the fuzzing mutates: blocks of every kind, comments first in a
#: body and on a header, repeated statements and headers, a docstring.
FUZZ_FILES = (
    TWICE_BEFORE,
    COMMENT_FIRST,
    '''"""A module."""
import os
from typing import Any

LIMIT = 4


class Buffer(Base):  # a comment
    """Doc."""

    size = 8

    @property
    def n(self):
        # first a comment
        return self._n

    def fill(self, xs):
        for x in xs:
            if x > LIMIT:
                continue
            elif x < 0:  # negative
                raise ValueError(x)
            else:
                self.data.append(x)
        while self.data:
            with self.lock:
                self.data.pop()
        try:
            self.flush()
        except OSError:
            pass
        finally:
            self.done = True
        return self.n


def helper(x):
    if x:
        return x + 1
    if x:
        return x + 1
    return 0
''',
)


def _mutated(text: str, rng: random.Random) -> str:
    """``text`` with one to three random line changes (the result may not
    parse: derive refuses that, with an error)."""
    lines = text.splitlines(keepends=True)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(lines))
        line = lines[at]
        indent = line[: len(line) - len(line.lstrip())]
        match rng.randrange(8):
            case 0:
                del lines[at]
            case 1:
                lines.insert(at, line)
            case 2:
                lines.insert(at, indent + "# a comment\n")
            case 3:
                lines[at] = line.replace("x", "y").replace("1", "2")
            case 4:
                lines.insert(at, indent + "check(x)\n")
            case 5:
                lines[at] = line.replace(":", " and ok:", 1) if ":" in line else line
            case 6:
                lines.insert(at, indent + "if ok:\n" + indent + "    pass\n")
            case _:
                lines[at] = indent + "    " + line.lstrip()
        if not lines:
            lines = ["pass\n"]
    return "".join(lines)


def test_derive_over_mutated_diffs_exits_0_or_2_never_a_traceback(
    tmp_path: Path,
) -> None:
    rng = random.Random(30)
    codes = {0: 0, 2: 0}
    for number in range(90):
        # The names a mutation brings in are the file's (an unknown name
        # is refused, rightly: the fuzzing is after the analysis beyond it).
        before = (
            "from helpers import check, make, ok, x, y\n"
            + FUZZ_FILES[number % len(FUZZ_FILES)]
        )
        after = _mutated(before, rng)
        if after == before:
            continue
        # Toy code: its attributes' runtime names are not what is tested.
        root = _tree(tmp_path / f"base{number}", {PATH: before}, partial=True).root
        diff = tmp_path / f"fix{number}.diff"
        diff.write_text(git_diff(PATH, before, after))
        code, output = run(*derive_args(diff, root, tmp_path / f"out{number}"))
        assert code in codes and "Traceback" not in output, (after, output)
        codes[code] += 1
    # Both outcomes were met: the fuzzing reaches past the diff's parser.
    assert codes[0] > 20 and codes[2] > 5, codes


def test_a_header_changed_into_one_the_block_already_has_is_told_apart() -> None:
    before = (
        "def f(x, y):\n    a = 0\n    if x:\n        a = 1\n    b = 0\n"
        "    if y:\n        a = 2\n    return a\n"
    )
    after = before.replace("if x:", "if y:")
    patch = derived(before, after)
    [edit] = patch.units[0].edits
    assert edit.kind == "header" and edit.block[-1].before is not None
    assert states(patch, before)["f"] == (PatchState.NEEDED, "")
    assert rewrite_text(patch, before, PATH) == after
    assert states(patch, after)["f"] == (PatchState.APPLIED, "")


def test_a_neighbour_the_fix_changes_is_not_recorded() -> None:
    # The statement before the second `if x:` is replaced by the same fix:
    # after the fix (or once that edit is made) it is not there to ask for.
    before = (
        "def f(x):\n    a = 1\n    if x:\n        b = 1\n    c = 1\n"
        "    if x:\n        b = 2\n    d = 1\n"
    )
    after = before.replace("c = 1", "c = 3").replace("b = 2", "b = 4")
    patch = derived(before, after)
    [step] = [e.block[-1] for e in patch.units[0].edits if len(e.block) == 2]
    assert step.before is None and step.after is not None
    assert step.after.code == "d = 1"
    assert states(patch, before)["f"] == (PatchState.NEEDED, "")
    assert rewrite_text(patch, before, PATH) == after
    assert states(patch, after)["f"] == (PatchState.APPLIED, "")


def test_a_module_if_whose_header_alone_changes_is_a_whole_statement_unit() -> None:
    before = "import os\n\nif os.name == 'nt':\n    SEP = 1\nelse:\n    SEP = 2\n"
    after = before.replace("os.name == 'nt'", "os.name in ('nt', 'ce')")
    [unit] = derived(before, after).units
    assert (unit.kind, unit.name) == ("module-statement", "if")
    assert [e.kind for e in unit.edits] == ["header"]
    # The unit reads as the statement, before and after (it parses).
    assert unit.before == before.split("\n\n")[1]
    assert unit.after == after.split("\n\n")[1]


# -- a def's header compared in the parts the fix changes (issue 40, item 4) -----

SIGNATURE_BEFORE = (
    "class Request:\n"
    "    def __init__(\n"
    "        self,\n"
    "        request_id: str,\n"
    "        prompt_is_token_ids: list[bool] | None = None,\n"
    "        priority: int = 0,\n"
    "        reasoning_ended: bool | None = None,\n"
    "    ) -> None:\n"
    "        self.request_id = request_id\n"
)
ENDED = "        reasoning_ended: bool | None = None,\n"
KWARGS = "        reasoning_parser_kwargs: dict | None = None,\n"
SIGNATURE_AFTER = SIGNATURE_BEFORE.replace(ENDED, ENDED + KWARGS)
#: 0.20.0's header: without a parameter the fix does not touch (vllm#41199).
WITHOUT_ONE = SIGNATURE_BEFORE.replace(
    "        prompt_is_token_ids: list[bool] | None = None,\n", ""
)


@pytest.mark.parametrize(
    "target",
    [
        WITHOUT_ONE,
        # Another default, a comment and a decorator: parts the fix keeps.
        SIGNATURE_BEFORE.replace(
            "priority: int = 0,", "priority: int = 1,  # ours"
        ).replace("    def __init__(", "    @traced\n    def __init__("),
    ],
    ids=["a-parameter-fewer", "other-parts-differ"],
)
def test_a_header_that_differs_where_the_fix_does_not_change_it_is_carried(
    target: str,
) -> None:
    patch = derived(SIGNATURE_BEFORE, SIGNATURE_AFTER)
    assert [e.kind for u in patch.units for e in u.edits] == ["header"]
    assert states(patch, target)["Request.__init__"] == (PatchState.NEEDED, "")
    fixed = rewrite_text(patch, target, PATH)
    assert fixed == target.replace(ENDED, ENDED + KWARGS)
    assert states(patch, fixed)["Request.__init__"] == (PatchState.APPLIED, "")
    assert rewrite_text(patch, fixed, PATH) == fixed


@pytest.mark.parametrize(
    ("target", "named"),
    [
        # The neighbour the fix inserts after is gone.
        (SIGNATURE_BEFORE.replace(ENDED, ""), "`reasoning_parser_kwargs`"),
        # The parameter the fix adds is there already, typed otherwise.
        (
            SIGNATURE_BEFORE.replace(
                ENDED, ENDED + "        reasoning_parser_kwargs: str = '',\n"
            ),
            "`reasoning_parser_kwargs`",
        ),
        # Another parameter between the neighbours.
        (
            SIGNATURE_BEFORE.replace(ENDED, ENDED + "        extra: int = 0,\n"),
            "`reasoning_parser_kwargs`",
        ),
    ],
    ids=["neighbour-gone", "added-there-otherwise", "another-in-between"],
)
def test_a_header_that_differs_where_the_fix_changes_it_drifts(
    target: str, named: str
) -> None:
    patch = derived(SIGNATURE_BEFORE, SIGNATURE_AFTER)
    state, reason = states(patch, target)["Request.__init__"]
    assert state is PatchState.DRIFTED
    assert reason.startswith("the header of Request.__init__ is neither the one")
    assert f"in its parameters {named}" in reason


def test_a_changed_parameter_must_be_as_the_fix_expects() -> None:
    """The fix changes ``priority``'s default: a target whose ``priority``
    is typed otherwise drifts, one that differs elsewhere is carried."""
    after = SIGNATURE_BEFORE.replace("priority: int = 0,", "priority: int = 5,")
    patch = derived(SIGNATURE_BEFORE, after)
    other = SIGNATURE_BEFORE.replace("priority: int = 0,", "priority: float = 0,")
    assert states(patch, other)["Request.__init__"][0] is PatchState.DRIFTED
    fixed = rewrite_text(patch, WITHOUT_ONE, PATH)
    assert fixed == WITHOUT_ONE.replace("priority: int = 0,", "priority: int = 5,")


def test_a_pattern_key_passes_over_other_kinds_and_never_its_own() -> None:
    """A key of a recorded statement tells a statement of another kind by
    its type alone, and a shape key one whose fields hold other kinds of
    value (a call where its own has a constant) by their types (no dump of
    it is made); it never turns away one of its own kind: a function's
    identity is any ``def`` of the name, sync or not."""
    from deepstack_patch.engine.derived.match import ShapeCache, _head, _Key

    code = """
@cache
async def load(self):
    return 1
def load(self):
    return 2
class Runner(Base):
    pass
if ready:
    go()
x = 1
x: int = 1
x = f(1)
y = 2
"""
    statements = ast.parse(code).body
    for node in statements:
        for key in (
            _Key(shapes.shape(node), "shape", "", _head(node)),
            _Key(shapes.identity(node), "identity", ""),
        ):
            cache = ShapeCache()
            kin = [other for other in statements if key.matches(other, cache)]
            assert node in kin
            others = [
                o
                for o in statements
                if type(o).__name__ not in key.kinds
                or (key.by == "shape" and _head(o) != _head(node))
            ]
            for other in others:
                assert id(other) not in cache.memo  # passed over undumped
    # Of one head, the shape tells: ``y = 2`` is not ``x = 1``.
    assign = _Key(shapes.shape(statements[-4]), "shape", "", _head(statements[-4]))
    assert [n for n in statements if assign.matches(n, ShapeCache())] == [
        statements[-4]
    ]
    load = _Key("def load", "identity", "")
    assert {type(n).__name__ for n in statements if load.matches(n, ShapeCache())} == {
        "AsyncFunctionDef",
        "FunctionDef",
    }

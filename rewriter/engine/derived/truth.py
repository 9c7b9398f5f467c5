"""One truth in a derived patch's data file: each unit's edits are the change
from its ``before`` to its ``after``.

A reviewer reads ``before`` and ``after``; the engine writes the edits. The
loader refuses a file where the two say different things (a hand-edited
``inserted`` that writes code ``after`` does not show, or an ``after`` edited
alone, which would change nothing). A unit records its code one of two ways,
as :func:`.units.units_of_change` made it:

- a function or method changed inside: ``before`` and ``after`` are the
  whole definition, and its edits are what the same differ finds between
  them (computed again here and compared);
- anything else (a definition added, removed or replaced whole, a class's
  header or statements, the module's statements, the imports): ``before``
  is the edits' removed code (or header before) one after the other,
  ``after`` their inserted code (or header after).

Code is compared as code (``ast.dump``): formatting and comments aside, a
different statement, name or string is a difference.
"""

from __future__ import annotations

import ast
import hashlib
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

from deepstack_patch.engine.derived.data import Anchor, Edit, Step, Unit
from deepstack_patch.engine.derived.match import one_statement, with_block
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.forked import Forked

#: A data file whose units are to agree: its units, its path (for the
#: error) and its bytes (for the record of files found in agreement; None:
#: none is kept).
Agreement = tuple[Sequence[Unit], object, bytes | None]


def refuse_disagreement(
    units: Sequence[Unit], path: object, data: bytes | None = None
) -> None:
    """A DeepstackError naming the data file ``path`` and the first unit
    whose edits and before/after disagree. Given the file's bytes as
    ``data``, a file this engine found in agreement before is not checked
    again (the check derives every function's edits anew: 0.4 s of a warm
    ``status`` with 40 derived patches)."""
    refuse_disagreements([(units, path, data)])


def refuse_disagreements(files: Sequence[Agreement]) -> None:
    """:func:`refuse_disagreement` of each data file (units, path, bytes) in
    turn: the first that disagrees is told. Those not found in agreement
    before are checked in two processes side by side where there are
    several: a first command on a folder of 40 derived fixes spent half a
    second on one core here, while ty had yet to start on the other."""
    todo = _not_found_agreeing(files)
    _told(todo, _side_by_side([units for units, _, _ in todo]))


#: A data file to check: its units, its path, and where its agreement is
#: recorded (None: nowhere).
_ToCheck = tuple[Sequence[Unit], object, Path | None]


def _not_found_agreeing(files: Sequence[Agreement]) -> list[_ToCheck]:
    """The files of ``files`` not found in agreement before (their marks)."""
    return [
        (units, path, marker)
        for units, path, data in files
        if (marker := _agreement_marker(data)) is None or not marker.exists()
    ]


def _told(todo: list[_ToCheck], found: list[tuple[str, str] | None]) -> None:
    """The first of ``todo`` that disagrees (``found``: each one's first
    disagreement) raised; each before it marked as agreeing."""
    for (_, path, marker), disagreeing in zip(todo, found, strict=True):
        _refused(disagreeing, path)
        _record(marker)


class AgreementAhead:
    """:func:`refuse_disagreements` of some data files worked out by a forked
    child while the command goes on (:func:`agreement_ahead`), told by
    :meth:`refuse`."""

    def __init__(self, todo: list[_ToCheck]) -> None:
        self._todo: list[_ToCheck] | None = todo
        units = [each for each, _, _ in todo]
        parent = os.getpid()

        def work() -> list[tuple[str, str] | None]:
            found = []
            for each in units:
                if os.getppid() != parent:  # the command ended meanwhile
                    os._exit(1)
                found.append(_first_disagreement(each))
            return found

        # Niced: it takes the cores the plan and ty leave (a first status of
        # 40 derived fixes spent 0.2 s of its first second on this check).
        self._child = Forked.start(work, nice=10) if todo else None

    def refuse(self) -> None:
        """Raise the first data file's disagreement, as
        :func:`refuse_disagreements` would (worked out here where the child
        gave no answer); once: a second call does nothing."""
        todo, self._todo = self._todo, None
        if todo is None:
            return
        child, self._child = self._child, None
        if child is not None and not child.ready():
            # Not done: niced on a busy host, it may be starved for seconds;
            # worked out here, it takes what it took before it was niced.
            child.stop()
            child = None
        found = _answered(child.answer() if child is not None else None, len(todo))
        if found is None:
            found = [_first_disagreement(units) for units, _, _ in todo]
        _told(todo, found)

    def stop(self) -> None:
        """The child stopped and reaped where its answer was not taken (a
        :meth:`refuse` after works it out here)."""
        child, self._child = self._child, None
        if child is not None:
            child.stop()


def agreement_ahead(files: Sequence[Agreement]) -> AgreementAhead:
    """:func:`refuse_disagreements` of ``files``, started: the files not found
    in agreement before go to a forked child at once, and its answer is
    told by :meth:`AgreementAhead.refuse` (``status`` takes it once its plan
    is made: its first second is spent on one core while ty has yet to
    start on the other)."""
    return AgreementAhead(_not_found_agreeing(files))


def _answered(answer: object, count: int) -> list[tuple[str, str] | None] | None:
    """A child's answer read back as :func:`_first_disagreement`'s, one for
    each of ``count`` files; None where it gave none that can be read."""
    try:
        found = [tuple(each) if each else None for each in answer]  # type: ignore[union-attr]
    except TypeError:
        return None
    return found if len(found) == count else None  # type: ignore[return-value]


def _first_disagreement(units: Sequence[Unit]) -> tuple[str, str] | None:
    """The first of ``units`` whose edits and before/after disagree, with
    what differs (:func:`disagreement`); None where all agree."""
    for unit in units:
        differs = disagreement(unit)
        if differs:
            return unit.part, differs
    return None


def _refused(disagreeing: tuple[str, str] | None, path: object) -> None:
    if disagreeing is not None:
        part, differs = disagreeing
        raise DeepstackError(
            f"unit {part}: its edits do not turn `before` into `after`: {differs}",
            "the engine writes the edits and a reviewer reads before and "
            "after: derive it again, or edit both",
            path=str(path),
        )


def _record(agreed: Path | None) -> None:
    if agreed is not None:
        try:
            agreed.parent.mkdir(parents=True, exist_ok=True)
            agreed.touch()
        except OSError:
            pass  # the cache is an optimisation, never a failure


def _side_by_side(files: Sequence[Sequence[Unit]]) -> list[tuple[str, str] | None]:
    """:func:`_first_disagreement` of each of ``files``: the last ones (half
    the code to read) in a forked child (:class:`.forked.Forked`), the
    others here meanwhile. One process does all where there is one file, no
    child, or the child gives no answer."""
    weights = [sum(len(u.before) + len(u.after) for u in units) for units in files]
    half, total, whole = 0, 0, sum(weights)
    while half < len(files) and 2 * (total + weights[half]) <= whole:
        total += weights[half]
        half += 1
    if not 0 < half < len(files):
        return [_first_disagreement(units) for units in files]
    import deepstack_patch.engine.derived.units  # noqa: F401 - imported once, here

    child = Forked.start(lambda: [_first_disagreement(units) for units in files[half:]])
    try:
        ours = [_first_disagreement(units) for units in files[:half]]
    except BaseException:
        if child is not None:
            child.stop()
        raise
    theirs = _answered(child.answer() if child is not None else None, len(files) - half)
    if theirs is None:  # no child, or it failed: its share here
        theirs = [_first_disagreement(units) for units in files[half:]]
    return [*ours, *theirs]  # type: ignore[list-item]


def _agreement_marker(data: bytes | None) -> Path | None:
    """Where the agreement of a data file of these bytes is recorded: under
    a key of the bytes and the engine's code (which decides what agrees);
    None where the cache is off or cannot be made, or no bytes are given."""
    if data is None or os.environ.get("DEEPSTACK_PATCH_NO_CACHE") == "1":
        return None
    from deepstack_patch.engine.cache import cache_dir
    from deepstack_patch.engine.derived.verdicts import engine_digest

    try:
        folder = cache_dir() / "agreed"
    except DeepstackError:
        return None
    key = hashlib.sha256(engine_digest().encode() + b"\0" + data).hexdigest()
    return folder / key[:2] / key


def disagreement(unit: Unit) -> str:
    """What differs between ``unit``'s edits and its before/after; ``""``
    where they agree."""
    if not _whole_definition(unit):
        return _concatenation_differs(unit)
    from deepstack_patch.engine.derived.units import edits_of_change

    try:
        computed = edits_of_change(unit.before, unit.after)
    except SyntaxError as exc:
        return f"`before` or `after` does not parse: {exc.msg} (line {exc.lineno})"
    differs = _edits_differ(unit.edits, computed, unit.name)
    kinds = {edit.kind for edit in unit.edits}
    # A file derived before a literal's entries, or comment lines, were
    # edits of their own records neither: still one truth.
    for by_entries, with_comments in ((False, True), (True, False), (False, False)):
        if not differs:
            break
        if ("entry" in kinds and not by_entries) or (
            "comments" in kinds and not with_comments
        ):
            continue
        earlier = edits_of_change(unit.before, unit.after, by_entries, with_comments)
        if not _edits_differ(unit.edits, earlier, unit.name):
            return ""
    return differs


def _whole_definition(unit: Unit) -> bool:
    """Whether the unit is a function or method changed inside: its edits
    lie in its own definition (a step into ``def NAME``), so ``before`` and
    ``after`` are the whole definition."""
    if unit.kind not in ("function", "method") or not unit.edits:
        return False
    name = unit.name.rsplit(".", 1)[-1]
    return all(
        any(_defined(step.header) == ("def", name) for step in edit.block)
        for edit in unit.edits
    )


def _defined(header: str) -> tuple[str, str] | None:
    """``("def", NAME)`` or ``("class", NAME)`` where a step's header is a
    definition (read as the engine reads a step); else None."""
    try:
        node = one_statement(with_block(header))
    except (SyntaxError, ValueError):
        return None  # not a definition's header: the comparison says the rest
    match node:
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
            return "def", name
        case ast.ClassDef(name=name):
            return "class", name
    return None


def _concatenation_differs(unit: Unit) -> str:
    # An edit holds statements or (a class's) header, never both.
    removed = "".join(edit.removed + edit.header_before for edit in unit.edits)
    inserted = "".join(edit.inserted + edit.header_after for edit in unit.edits)
    # Comment lines are text: the code of any two is the same.
    exact = any(edit.kind == "comments" for edit in unit.edits)
    for side, recorded, joined, field in (
        ("before", unit.before, removed, "removed"),
        ("after", unit.after, inserted, "inserted"),
    ):
        if recorded != joined and (exact or _code(recorded) != _code(joined)):
            ours, theirs = _first_difference(recorded, joined)
            return f"`{side}` has {ours} where its edits' `{field}` code has {theirs}"
    return ""


def _edits_differ(
    recorded: Sequence[Edit], computed: Sequence[Edit], unit_name: str
) -> str:
    if len(recorded) != len(computed):
        return (
            f"it has {len(recorded)} edit(s), the change from `before` to "
            f"`after` is {len(computed)}"
        )
    # The recorded blocks start at the module (a class, a block on the way);
    # the ones computed here at the unit's own definition.
    prefixes = set()
    for number, (ours, theirs) in enumerate(zip(recorded, computed, strict=True), 1):
        cut = len(ours.block) - len(theirs.block)
        if cut < 0:
            return f"edit {number}'s block is not inside the unit"
        prefixes.add(ours.block[:cut])
        differs = _edit_differs(ours, theirs, ours.block[cut:])
        if differs:
            return f"edit {number} ({ours.kind}): {differs}"
    if len(prefixes) > 1:
        return "its edits lead to the unit through different blocks"
    # The way to the unit is its name: a class renamed on the way would
    # rewrite another unit than the one shown.
    way = [_defined(step.header) for step in next(iter(prefixes), ())]
    names = [found[1] for found in way if found is not None]
    if names != unit_name.split(".")[:-1]:
        where = ".".join(names) or "the module"
        return f"its edits lead to {where}, not to {unit_name}"
    return ""


def _edit_differs(ours: Edit, theirs: Edit, our_block: Sequence[Step]) -> str:
    if ours.kind != theirs.kind:
        return (
            f"kind is {ours.kind!r}, the change from `before` to `after` is "
            f"of kind {theirs.kind!r}"
        )
    if not _same_steps(our_block, theirs.block):
        return "its block is not where `before` and `after` differ"
    for name in ("removed", "inserted", "header_before", "header_after"):
        mine, computed = getattr(ours, name), getattr(theirs, name)
        # Comment lines are text: the code of any two is the same.
        if mine != computed and (
            ours.kind == "comments" or _code(mine) != _code(computed)
        ):
            ours, theirs = _first_difference(mine, computed)
            return (
                f"`{name}` has {ours} where the change from `before` to `after` "
                f"has {theirs}"
            )
    for name in ("before_anchor", "after_anchor"):
        if not _same_anchor(getattr(ours, name), getattr(theirs, name)):
            return f"`{name}` is not the neighbour `before` shows"
    return ""


def _same_steps(ours: Sequence[Step], theirs: Sequence[Step]) -> bool:
    return len(ours) == len(theirs) and all(
        a == b or (a.field == b.field and _code(a.header) == _code(b.header))
        for a, b in zip(ours, theirs, strict=True)
    )


def _same_anchor(ours: Anchor | None, theirs: Anchor | None) -> bool:
    if ours is None or theirs is None:
        return ours is theirs
    return ours == theirs or (
        ours.match == theirs.match and _code(ours.code) == _code(theirs.code)
    )


def _code(text: str) -> str:
    """Code as the engine reads it, formatting and comments aside; a
    definition's header (no body) is read with a placeholder body."""
    source = textwrap.dedent(text)
    for attempt in (source, source.rstrip("\n") + "\n    ...\n"):
        try:
            return ast.dump(ast.parse(attempt))
        except SyntaxError:
            continue
    return text


def _first_difference(ours: str, theirs: str) -> tuple[str, str]:
    """The first line where two pieces of code differ, quoted from each."""
    mine = [line.strip() for line in ours.splitlines() if line.strip()]
    other = [line.strip() for line in theirs.splitlines() if line.strip()]
    at = next(
        (i for i, (a, b) in enumerate(zip(mine, other, strict=False)) if a != b),
        min(len(mine), len(other)),
    )
    return _quote(mine[at:]), _quote(other[at:])


def _quote(lines: Sequence[str]) -> str:
    if not lines:
        return "nothing"
    line = lines[0] if len(lines[0]) <= 70 else lines[0][:67] + "..."
    return f"`{line}`"

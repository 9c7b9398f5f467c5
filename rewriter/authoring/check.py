"""derive's self-check: what a derived patch must hold on its base before
anything is written (docs/derive.md, "What derive checks before it writes").

On the base it is needed at the diff's own sites and nowhere else; applied
to the base it gives the diff's result (the text, else the code); that
result and the diff's own are recognised applied, and a second pass over
either changes nothing; and the data file is one truth (the loader's check).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from deepstack_patch.engine.derived import DerivedPatch, docstrings
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.source import SourceFile
from deepstack_patch.engine.tree import VllmTree


def checked_round_trip(
    patch: DerivedPatch,
    base: VllmTree,
    checked_on: Callable[[DerivedPatch], VllmTree] | None,
    results: dict[str, tuple[str, str]],
) -> tuple[str, list[str]]:
    """:func:`self_check` on ``base`` (or the tree ``checked_on`` gives for
    the patch): its round trip, and its notes, where the rewrite's text is
    not the diff's result."""
    checked: list[str] = []
    tree = base if checked_on is None else checked_on(patch)
    return self_check(patch, tree, results, checked), checked


def self_check(
    patch: DerivedPatch,
    base: VllmTree,
    results: dict[str, tuple[str, str]],
    notes: list[str] | None = None,
) -> str:
    """The checks before anything is written; how the round trip compared:
    ``text`` where the rewrite writes the diff's result (what ``git apply``
    writes), else ``ast``, with a note in ``notes`` saying where the text
    differs."""
    from deepstack_patch.engine.plan import plan_tree

    _one_truth(patch)

    # The base's lines the whole diff changes, read from the base and the
    # result: in a format-patch series a later patch's hunks count the lines
    # of the file as the earlier patches left it, not the base's.
    hunk_lines = {
        path: changed_lines(before, after) for path, (before, after) in results.items()
    }
    plan = plan_tree(base, [patch], rewrite=True)
    report = plan.report(patch.id)
    # On the base it is needed at the diff's own sites, and nowhere else.
    for unit in patch.units:
        where = [loc for loc in report.locations if loc.finding.part == unit.part]
        if not where:
            raise _check_failed(f"{unit.description} is not found on the base")
        for location in where:
            finding = location.finding
            if finding.state is not PatchState.NEEDED:
                # An applied unit has no reason of its own: say what it means.
                why = finding.reason or (
                    "the base has what it adds already"
                    if finding.state is PatchState.APPLIED
                    else ""
                )
                raise _check_failed(
                    f"on the base {unit.description} is {finding.state}, not "
                    f"needed" + (f": {why}" if why else "")
                )
            first, last = finding.span
            if not any(
                first <= end and start <= last
                for start, end in hunk_lines.get(location.path, [])
            ):
                raise _check_failed(
                    f"on the base {unit.description} matches at "
                    f"{location.path}:{first}-{last}, which the diff does not change"
                )
    edited = {edit.relpath: edit.new for edit in plan.edits}
    compared = _compared(patch, results, edited, notes)

    # The result is recognised applied, and so is the diff's own result; a
    # second pass over either changes nothing (only needed findings are ever
    # rewritten, and rewrite_text runs the engine's pass to show it).
    for path, (_before, after) in results.items():
        if path in patch.whole_files:
            _whole_file_applied(patch, path)
            continue
        ours = edited[path].decode("utf-8")
        for text, what in ((ours, "its rewrite"), (after, "the diff's result")):
            source = SourceFile(path, text.encode("utf-8"))
            states = patch.recognise(source.ast, path)
            wrong = [f for f in states if f.state is not PatchState.APPLIED]
            if wrong or len(states) != sum(u.path == path for u in patch.units):
                raise _check_failed(
                    f"{what} of {path} is not recognised applied: "
                    + (
                        ", ".join(
                            f"{f.symbol} {f.state} {f.reason}".strip() for f in wrong
                        )
                        or "a unit is missing"
                    )
                )
            if _second_pass(patch, source) != text:
                raise _check_failed(f"a second pass over {what} of {path} changes it")
    return compared


def _whole_file_applied(patch: DerivedPatch, path: str) -> None:
    """A file the fix adds is recognised applied with its text; one it
    deletes, where it is absent."""
    text = patch.whole_file(path)
    if text is None:
        states = patch.recognise_missing(path)
    else:
        states = patch.recognise(SourceFile(path, text).ast, path)
    wrong = [f for f in states if f.state is not PatchState.APPLIED]
    if wrong or len(states) != 1:
        raise _check_failed(
            f"the diff's result of {path} is not recognised applied: "
            + (", ".join(f"{f.state} {f.reason}".strip() for f in wrong) or "no state")
        )


def _compared(
    patch: DerivedPatch,
    results: dict[str, tuple[str, str]],
    edited: dict[str, bytes],
    notes: list[str] | None,
) -> str:
    """Applied to the base, it gives the diff's result: ``text`` where it
    writes the diff's text, ``ast`` where only its code (said in a note)."""
    compared = "text"
    for path, (before, after) in results.items():
        if path not in edited:
            raise _check_failed(f"its rewrite leaves {path} unchanged")
        ours = SourceFile(path, edited[path]).text
        if ours == after:
            continue
        # The docstrings derive left out (with a note) are the base's.
        units = [unit for unit in patch.units if unit.path == path]
        left_out = docstrings.left_out(before, after, units)
        if _code(ours, left_out) != _code(after, left_out):
            raise _check_failed(
                f"its rewrite of {path} is not the diff's result:\n"
                + _short_diff(after, ours)
            )
        compared = "ast"
        if notes is not None:
            notes.append(_text_note(path, after, ours))
    return compared


def _code(text: str, left_out: list[str]) -> str:
    return ast.dump(docstrings.without_docstrings(ast.parse(text), left_out))


def _one_truth(patch: DerivedPatch) -> None:
    """The data file is one truth: the loader would refuse it otherwise."""
    from deepstack_patch.engine.derived.truth import disagreement

    for unit in patch.units:
        differs = disagreement(unit)
        if differs:
            raise _check_failed(
                f"{unit.description}: its edits do not turn its code before "
                f"into its code after: {differs}"
            )


def changed_lines(before: str, after: str, context: int = 3) -> list[tuple[int, int]]:
    """The 1-based spans of ``before`` that differ in ``after``, each widened
    by ``context`` lines as a unified diff's hunk is."""
    import difflib

    matcher = difflib.SequenceMatcher(
        None, before.splitlines(), after.splitlines(), autojunk=False
    )
    return [
        (max(1, first + 1 - context), max(first + 1, last) + context)
        for tag, first, last, _, _ in matcher.get_opcodes()
        if tag != "equal"
    ]


def _second_pass(patch: DerivedPatch, source: SourceFile) -> str:
    from deepstack_patch.engine.plan import rewrite_text

    needed = [
        f
        for f in patch.recognise(source.ast, source.relpath)
        if f.state is PatchState.NEEDED
    ]
    return rewrite_text(patch, source.text, source.relpath) if needed else source.text


def _text_note(path: str, after: str, ours: str) -> str:
    """Where the rewrite's text is not the diff's result (the same code)."""
    import difflib

    matcher = difflib.SequenceMatcher(
        None, after.splitlines(), ours.splitlines(), autojunk=False
    )
    lines = [
        first + 1 for tag, first, _, _, _ in matcher.get_opcodes() if tag != "equal"
    ]
    where = ", ".join(str(line) for line in lines[:5]) + (
        " and more" if len(lines) > 5 else ""
    )
    return (
        f"{path}: the rewrite's text differs from the diff's result at line(s) "
        f"{where} of the result (the same code: a comment, docstring or blank "
        "line the fix changes away from the statements it changes is not carried)"
    )


def _check_failed(reason: str) -> DeepstackError:
    return DeepstackError(
        f"the derived patch fails its self-check: {reason}",
        "nothing was written; the diff may change code this tool cannot carry "
        "as data (report it), or the base is not the one the PR was made "
        "against",
    )


def _short_diff(expected: str, got: str) -> str:
    import difflib

    lines = difflib.unified_diff(
        expected.splitlines(keepends=True),
        got.splitlines(keepends=True),
        "the diff's result",
        "the rewrite",
        n=1,
    )
    return "".join(list(lines)[:30])

"""Derived patches: a fix made from an upstream diff, kept as data.

For every unit the diff changes (a function, a method, a class's or the
module's statements, the module's imports) the data file holds the code
before and after, and the edits between them: which statements a fix
removes, which it inserts, in which block, between which neighbours (the
anchors). The engine reads it with the same four states as a hand-written
patch (see :meth:`DerivedPatch.recognise`): statements are compared by their
``ast.dump`` without positions and docstrings (:mod:`.shapes`), so
formatting and comments never matter, and nothing is guessed: a unit is
looked up by its qualified name in the file the diff names, each block by
its header, each edit by its anchors, and every one must be found exactly
once.

The data file is TOML (schema 1), one per patch; docs/derive.md describes it.
"""

from __future__ import annotations

import ast
import codecs
import contextlib
import functools
import hashlib
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.derived import (
    comments,
    docstrings,
    entries,
    files,
    imports,
    moved,
    names,
    rename,
    shapes,
    signature,
)
from deepstack_patch.engine.derived.data import (
    BROKEN_HINT,
    DOCUMENTATION,
    Edit,
    SkippedTest,
    Unit,
    dump_derived,
    pull_request_url,
    read_fields,
)
from deepstack_patch.engine.derived.match import (
    CompiledEdit,
    ShapeCache,
    body_state,
    code_uses,
    find_step,
    occurrences,
    one_statement,
    statement_line,
)
from deepstack_patch.engine.derived.never import NeverHere, serving_only
from deepstack_patch.engine.derived.reads import module_files
from deepstack_patch.engine.derived.runtime import PACKAGE_FILES, settle_runtime
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import (
    THERE_ALREADY,
    Finding,
    Patch,
    PatchState,
    RecordedTest,
)

if TYPE_CHECKING:
    import libcst
    from deepstack_patch.engine.derived.rewrite import UnitToMake
    from deepstack_patch.engine.derived.truth import Agreement


#: What a unit whose code is in still lacks, by edit kind (its reason).
_REWORDED = {"docstring": "docstring", "comments": "comment lines"}

#: A needed unit's detail for an edit that is made already (its docstring
#: edit alone is to write): the rewrite leaves it.
APPLIED_EDIT = "applied"


class DerivedPatch(Patch):
    """A patch made from data (see the module's docstring)."""

    @staticmethod
    def ahead_of_plan(root: Path) -> contextlib.AbstractContextManager[None]:
        """The package's imports scanned in a forked child while the plan
        starts (:func:`.import_lists.scanning_ahead`)."""
        from deepstack_patch.engine.derived.import_lists import scanning_ahead

        return scanning_ahead(root)

    def __init__(
        self,
        *,
        id: str,  # noqa: A002 - the Patch protocol's name
        title: str,
        symptom: str,
        base: str,
        paths: Sequence[str],
        units: Sequence[Unit],
        tests: Sequence[RecordedTest] = (),
        requires: Sequence[str] = (),
        origin: str = "",
        base_tree: str = "",
        upstream_url: str = "",
        fixed_in: str = "",
        skipped_tests: Sequence[SkippedTest] = (),
        commit: str = "",
        not_carried: Sequence[str] = (),
    ) -> None:
        self.id = id
        self.title = title
        self.symptom = symptom
        self.base = base
        self.base_tree = base_tree
        #: The upstream commit it was derived from (``derive --commit``), else "".
        self.commit = commit
        self.upstream_url = upstream_url or pull_request_url(id)
        #: The first vLLM release with the fix, when its author named one.
        self.fixed_in = fixed_in
        self.paths = tuple(paths)
        self.units = tuple(units)
        self.recorded_tests = tuple(tests)
        #: The diff's test files left out of the proof, and why.
        self.skipped_tests = tuple(skipped_tests)
        #: What of the upstream fix it does not carry, as derive said it (a
        #: file that is not Python, a comment at the end of a line): shown
        #: with its state, which speaks of what it carries only.
        self.not_carried = tuple(not_carried)
        self.requires = tuple(requires)
        self.origin = origin or "derived"
        #: The engine refuses to apply it in part (see plan_tree).
        self.applies_whole = True
        #: It reads the modules its fix imports from (derived/names.py).
        self.reads_tree = True
        # Paths are exact files: every one is read.
        self.markers = (b"",)
        self.parts = {unit.part: unit.description for unit in self.units}
        self.also_changes = (
            "Nothing beyond the statements of the upstream diff (the data file "
            "shows each unit before and after)."
        )
        #: The files it adds or deletes whole (engine/plan.py).
        self.whole_files = tuple(u.path for u in self.units if u.whole_file)
        #: The parts that change only documentation: left out where their
        #: text is neither the old nor the new, never holding the code back
        #: (engine/whole.py).
        self.documentation_parts = frozenset(
            u.part for u in self.units if u.documentation_only
        )
        #: The parts that are the file's imports: they go with the code
        #: that needs them (engine/whole.py).
        self.import_parts = frozenset(u.part for u in self.units if u.kind == "import")
        self._compiled: dict[Edit, CompiledEdit] = {}
        self._fingerprint = b""

    @functools.cached_property
    def also_reads(self) -> tuple[str, ...]:  # type: ignore[override]
        """The files of the modules its fix reads (after load checked that
        its code parses), and the release's whole ``vllm`` package, where
        its runtime names are looked up (engine/derived/runtime.py)."""
        folders = files.folders_read(self.units)  # where new files go
        return (*module_files(self.units), *folders, *PACKAGE_FILES)

    def serving_only(
        self, needed: Collection[str], never: Collection[str]
    ) -> list[str]:
        """The names the ``needed`` parts only bind for the ``never`` parts
        (:func:`.never.serving_only`, engine/whole.py)."""
        return serving_only(self.units, needed, never)

    def part_file(self, part: str) -> str:
        """A unit's part is ``path::name``: the file is the unit's own."""
        return next((unit.path for unit in self.units if unit.part == part), "")

    def part_label(self, part: str) -> str:
        """``path::label`` (``Unit.label``: unnamed statements by their code)."""
        unit = next((unit for unit in self.units if unit.part == part), None)
        return f"{unit.path}::{unit.label}" if unit is not None else part

    # -- recognition ---------------------------------------------------

    def recognise(self, tree: ast.Module, path: str) -> list[Finding]:
        units = [unit for unit in self.units if unit.path == path]
        if not units:
            return []
        if units[0].whole_file:
            return [files.still_imported(self, files.present(units[0], tree))]
        states = self.unit_states(tree, path)
        # A unit found under another name is read there (its names too).
        units = [moved.placed(unit, states[unit.part]) for unit in units]
        # Whole, never by its imports alone, and only code whose names
        # resolve (engine/derived/names.py).
        states = names.settle(self, units, states, tree, path)
        # ... and what it reads at run time is there (engine/derived/runtime.py).
        states = settle_runtime(self, units, states, path)
        return [
            Finding(
                state=state.state,
                symbol=unit.name,
                line=state.line or state.span[0],
                span=state.span,
                reason=state.reason,
                part=unit.part,
                details=state.details,
            )
            for unit in units
            # None: the report says target absent, no <unit> in this tree
            if (state := states[unit.part]) is not None
        ]

    def recognise_missing(self, path: str) -> list[Finding]:
        """A file it adds or deletes, where the tree lacks it (:mod:`.files`)."""
        unit = self._whole_unit(path)
        return [] if unit is None else files.missing(self, unit)

    def whole_file_states(self, path: str) -> list[Finding]:
        """A file it adds or deletes, as the tree being recognised has it."""
        return files.in_tree(self, self._whole_unit(path))

    def whole_file(self, path: str) -> bytes | None:
        """A file it adds (its bytes) or deletes (None), after the fix."""
        unit = self._whole_unit(path)
        assert unit is not None, path
        return files.after_fix(unit)

    def _whole_unit(self, path: str) -> Unit | None:
        return next((u for u in self.units if u.path == path and u.whole_file), None)

    def unit_states(self, tree: ast.Module, path: str) -> dict[str, _UnitState | None]:
        """Each unit of ``path`` recognised on its own (None: absent)."""
        units = [unit for unit in self.units if unit.path == path]
        shapes_of = ShapeCache()
        # The imports last: whether a name the fix stops importing is still
        # used depends on the code the other units will have after the fix.
        # Where no other unit is needed, the fix is in: an import it dropped
        # that is still there is left alone (a vendor's, or harmless).
        uses_after_fix: Counter[str] | None = None
        states: dict[str, _UnitState | None] = {}
        for unit in sorted(units, key=lambda unit: unit.kind == "import"):
            state = self._state_of(unit, tree, shapes_of, uses_after_fix)
            # Documentation is carried where it is, never followed elsewhere.
            if state is None and not unit.documentation_only:
                state = self._moved(unit, tree, shapes_of, uses_after_fix, states)
            states[unit.part] = state
            if unit.kind != "import" and state and state.state is PatchState.NEEDED:
                uses_after_fix = uses_after_fix or Counter()
                for edit in unit.edits:
                    uses_after_fix.subtract(code_uses(edit.removed, edit.header_before))
                    uses_after_fix.update(code_uses(edit.inserted, edit.header_after))
        return states

    def _state_of(
        self,
        unit: Unit,
        tree: ast.Module,
        shapes_of: ShapeCache,
        uses_after_fix: Counter[str] | None,
    ) -> _UnitState | None:
        """The unit recognised where its data says, up to a renaming of its
        function's locals (None: its definition is absent)."""
        state = self._recognise_unit(unit, tree, shapes_of, uses_after_fix)
        if state is not None and state.state is PatchState.DRIFTED:
            state = self._renamed(unit, tree, state, uses_after_fix)
        return state

    def _moved(
        self,
        unit: Unit,
        tree: ast.Module,
        shapes_of: ShapeCache,
        uses: Counter[str] | None,
        earlier: dict[str, _UnitState | None],
    ) -> _UnitState | None:
        """An absent unit looked for among the file's other functions of its
        name (:mod:`.moved`), never where another of its units is or was
        found; None where the code it removes is nowhere."""
        others = {u.name for u in self.units if u.path == unit.path} - {unit.name}
        taken = {s.details.get(moved.FOUND_AS, "") for s in earlier.values() if s}
        found_as = moved.found_elsewhere(
            unit,
            tree,
            # As recorded: a moved function with renamed locals is too far.
            lambda placed: self._recognise_unit(placed, tree, shapes_of, uses),
            frozenset(others | taken),
        )
        if found_as is not None:
            return found_as
        edits = [self._compile(edit) for edit in unit.edits]
        found = moved.removed_at(unit, edits, tree, shapes_of, frozenset(others))
        if found is None:
            return None
        reason, span, line = found
        return _UnitState(PatchState.DRIFTED, span, reason, line=line)

    def _recognise_unit(
        self,
        unit: Unit,
        tree: ast.Module,
        shapes_of: ShapeCache,
        uses_after_fix: Counter[str] | None,
    ) -> _UnitState | None:
        if unit.documentation_only:
            return self._documentation_state(unit, tree, shapes_of)
        states: list[tuple[PatchState, str]] = []
        spans: list[tuple[int, int]] = []
        lines: list[int] = []
        never_here = NeverHere(tree, unit.path)
        alone = sum(edit.kind not in DOCUMENTATION for edit in unit.edits) == 1
        details: dict[str, Any] = {}
        notes: list[str] = []
        for index, edit in enumerate(unit.edits):
            compiled = self._compile(edit)
            if edit.kind in DOCUMENTATION:  # rides along, never counts
                located = _locate(compiled, tree, shapes_of)
                if isinstance(located, _Located):
                    todo, note, span = _documentation_riding(
                        compiled, located, tree, shapes_of
                    )
                    details[str(index)] = todo
                    notes += [note] if note else []
                    spans += [span] if span else []
                continue
            if edit.kind == "imports":
                state, reason, span, edit_details = imports.recognise_imports(
                    compiled, tree, shapes_of, uses_after_fix, unit.edits
                )
                details[str(index)] = edit_details
            else:
                located = _locate(compiled, tree, shapes_of)
                if located is None:
                    return None
                # Shown at its def, also where a block inside it drifted.
                node = (
                    located.unit_node
                    if isinstance(located, _Drifted)
                    else located.target or located.unit_node
                )
                if not isinstance(node, ast.Module):
                    lines.append(_lines(node)[0])
                elif isinstance(located, _Located):
                    # A module's statement is shown at its own line, not
                    # at the first line of the block around it.
                    lines += statement_line(compiled, located.block, shapes_of)
                if isinstance(located, _Drifted):
                    states.append(
                        never_here.judge(unit, edit, located.reason, alone=alone)
                    )
                    spans.append(_lines(node))
                    continue
                if edit.kind == "entry":
                    entry = _recognise_entry(compiled, located, unit.kind)
                    if entry is None:  # the literal is not in this tree
                        return None
                    state, reason, span, line = entry
                    lines += [line] if line else []
                else:
                    state, reason, span = _recognise_edit(
                        compiled, located, shapes_of, unit.name
                    )
                if state is PatchState.DRIFTED:
                    state, reason = never_here.judge(unit, edit, reason, alone=alone)
            states.append((state, reason))
            spans.append(span)
        first = min((s for s, _ in spans), default=1)
        last = max((e for _, e in spans), default=first)
        line = min(lines, default=0)
        kinds = {state for state, _ in states}
        if kinds == {PatchState.NEEDED}:
            note = "; ".join(notes)
            return _UnitState(PatchState.NEEDED, (first, last), note, details, line)
        if kinds == {PatchState.APPLIED}:
            reworded = _still_reworded(unit, details)
            if reworded:
                # Never applied while an edit is missing: the code is in,
                # its documentation is still the one the fix rewords; the
                # rewrite writes only that (APPLIED_EDIT marks the others).
                return _UnitState(
                    PatchState.NEEDED, (first, last), reworded, details, line
                )
            return _UnitState(PatchState.APPLIED, (first, last), "", line=line)
        if PatchState.NOT_APPLICABLE in kinds and kinds <= {
            PatchState.NOT_APPLICABLE,
            PatchState.APPLIED,
        }:
            return _never_state(states, never_here.there_already.get(unit.part),
                                (first, last), line)  # fmt: skip
        drifted = [r for s, r in states if s is PatchState.DRIFTED]
        reason = "; ".join(drifted) or (
            "part of the fix is there and part is not: "
            + ", ".join(f"edit {i + 1} {s}" for i, (s, _) in enumerate(states))
        )
        return _UnitState(PatchState.DRIFTED, (first, last), reason, line=line)

    def _documentation_state(
        self, unit: Unit, tree: ast.Module, shapes_of: ShapeCache
    ) -> _UnitState | None:
        """A unit whose edits change only documentation: ``needed`` where the
        text the fix edits is there exactly, ``applied`` where the fixed text
        is; where neither, ``not-applicable`` with the reason ``left out: ...``
        (docs/derive.md: it never holds the fix's code back, and the patch is
        never ``applied`` while it is left out, engine/whole.py). None where
        its definition is absent."""
        details: dict[str, Any] = {}
        spans: list[tuple[int, int]] = []
        left_out: list[str] = []
        for index, edit in enumerate(unit.edits):
            compiled = self._compile(edit)
            located = _locate(compiled, tree, shapes_of)
            if located is None:
                return None
            if isinstance(located, _Drifted):
                left_out.append(located.reason)
                continue
            if edit.kind == "comments":
                text = comments.lines_of(tree)
                found = comments.action(compiled, located.block, text, shapes_of)
                spans.append(found.span)
                if found.todo is None:
                    left_out.append(
                        f"the comments above {found.above} in "
                        f"{_where(located.owner)} {found.why}"
                    )
                elif found.todo:
                    details[str(index)] = comments.details_of(found.todo)
                continue
            spans.append(_documentation_span(located))
            todo = docstrings.exact_action(compiled, located.block)
            if todo is None:
                left_out.append(
                    f"the docstring of {_documented(unit, located)} is neither "
                    "the one the fix edits nor the fixed one"
                )
            elif todo:
                details[str(index)] = docstrings.details_of(todo)
        first = min((s for s, _ in spans), default=1)
        span = (first, max((e for _, e in spans), default=first))
        reason = "left out: " + "; ".join(left_out) if left_out else ""
        if details:
            return _UnitState(PatchState.NEEDED, span, reason, details, first)
        if left_out:
            return _UnitState(PatchState.NOT_APPLICABLE, span, reason, line=first)
        return _UnitState(PatchState.APPLIED, span, "", line=first)

    def _renamed(
        self, unit: Unit, tree: ast.Module, state: _UnitState, uses: Counter[str] | None
    ) -> _UnitState:
        """The unit recognised up to a consistent renaming of its function's
        locals (:mod:`.rename`); ``state`` where there is none."""
        edits = [c for c in map(self._compile, unit.edits) if rename.followed(c)]
        target = rename.function_of(tree, edits[0]) if edits else None
        if target is None or unit.kind not in ("function", "method"):
            return state
        recorded = one_statement(unit.before)
        renaming = rename.renaming_of(edits, recorded, target)
        if not renaming or isinstance(renaming, str):
            state.reason = "; ".join(filter(None, [state.reason, renaming or ""]))
            return state
        renamed_back = rename.renamed_back(tree, target, renaming)
        found = self._recognise_unit(unit, renamed_back, ShapeCache(), uses)
        if found is None or found.state is PatchState.DRIFTED:
            return state
        why = rename.collision(edits, recorded, target, renaming)
        if found.state is PatchState.NEEDED and why:
            return _UnitState(PatchState.DRIFTED, found.span, why, line=found.line)
        found.details["renaming"] = renaming
        return found

    @property
    def data_fingerprint(self) -> bytes:
        """A digest of the data (the recognition cache keys on it)."""
        if not self._fingerprint:
            import hashlib

            self._fingerprint = hashlib.sha256(dump_derived(self).encode()).digest()
        return self._fingerprint

    def _compile(self, edit: Edit) -> CompiledEdit:
        if edit not in self._compiled:
            self._compiled[edit] = CompiledEdit.of(edit)
        return self._compiled[edit]

    # -- rewrite ---------------------------------------------------------

    def rewrite(
        self, module: libcst.Module, needed: Sequence[Finding]
    ) -> libcst.Module:
        from deepstack_patch.engine.derived import rewrite

        placed = self._placed(needed)
        module = rewrite.apply_edits(module, self._to_make(placed))
        for finding, unit in placed:  # the docstrings the fix edits ride along
            for index, edit in enumerate(unit.edits):
                if edit.kind == "docstring" and finding.details.get(str(index)):
                    module = docstrings.rewrite(module, self._compile(edit))
        return module

    def rewrite_text(self, code: bytes, needed: Sequence[Finding]) -> bytes | None:
        """:meth:`rewrite` on the file's bytes, without a LibCST module: the
        edits are made on text, and a module parsed only to be printed again
        was a third of a drift corpus's time. None where it needs the module
        (a file not in plain UTF-8, a docstring that shares a line with other
        code): the caller rewrites the module then."""
        from deepstack_patch.engine.derived import rewrite

        if _declares_another_encoding(code) or code.startswith(codecs.BOM_UTF8):
            return None
        try:
            text = code.decode("utf-8")
        except UnicodeDecodeError:
            return None
        placed = self._placed(needed)
        # As rewrite() makes them: the code's edits, then the docstrings.
        documented = [
            self._compile(edit)
            for finding, unit in placed
            for index, edit in enumerate(unit.edits)
            if edit.kind == "docstring" and finding.details.get(str(index))
        ]
        newline = _first_newline(text)
        made = rewrite.edited_code(text, newline, self._to_make(placed))
        try:
            made = rewrite.edited_docstrings(made, newline, documented)
        except rewrite.NeedsModule:
            return None
        return made.encode("utf-8")

    def _placed(self, needed: Sequence[Finding]) -> list[tuple[Finding, Unit]]:
        """Each needed finding with its unit, placed where the finding is."""
        by_part = {unit.part: unit for unit in self.units}
        return [(f, moved.placed(by_part[f.part], f)) for f in needed]

    def _to_make(self, placed: Sequence[tuple[Finding, Unit]]) -> list[UnitToMake]:
        """The edits to make of each placed unit (docstrings aside, and
        those recognition found made already), with its renaming."""
        return [
            (
                unit,
                [
                    (self._compile(edit), finding.details.get(str(index), {}))
                    for index, edit in enumerate(unit.edits)
                    if edit.kind != "docstring"
                    and not finding.details.get(str(index), {}).get(APPLIED_EDIT)
                    # Comment lines only where recognition found the old ones.
                    and (edit.kind != "comments" or finding.details.get(str(index)))
                ],
                finding.details.get("renaming", {}),
            )
            for finding, unit in placed
        ]

    def prove(self, tree: Path) -> None:
        raise NotImplementedError(
            "a derived patch is proved by its recorded tests (verify runs them)"
        )


@dataclass
class _UnitState:
    state: PatchState
    span: tuple[int, int]
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    line: int = 0  # the def's first line, not the blanks above it the span has


def _never_state(
    states: list[tuple[PatchState, str]],
    there_already: list[str] | None,
    span: tuple[int, int],
    line: int,
) -> _UnitState:
    """What the fix changes was never here (the rest, if any, is already as
    the fix leaves it): a bug this release never had, saying which names of
    the fix's the function reads already (:data:`THERE_ALREADY`)."""
    never = [reason for state, reason in states if state is PatchState.NOT_APPLICABLE]
    details = {THERE_ALREADY: there_already} if there_already else {}
    return _UnitState(
        PatchState.NOT_APPLICABLE, span, "; ".join(dict.fromkeys(never)), details, line
    )


@dataclass
class _Located:
    """Where an edit's block is in a tree: the block and what owns it."""

    block: list[ast.stmt]
    owner: ast.AST  # the module or the compound statement holding the block
    unit_node: ast.AST  # the innermost definition on the way (or the module)
    target: ast.stmt | None = None  # a header edit's definition
    #: The first line after the statement before the unit's definition: the
    #: blank lines above a definition belong to its span (a rewrite that
    #: adds a decorator may be diffed as adding lines there).
    unit_first: int = 1


def _locate(
    compiled: CompiledEdit, tree: ast.Module, shapes_of: ShapeCache
) -> _Located | _Drifted | None:
    """The edit's block in ``tree``; None where a definition on the way is
    absent (the unit is not in this tree); why not, where it drifted."""
    block: list[ast.stmt] = tree.body
    owner: ast.AST = tree
    unit_node: ast.AST = tree
    unit_first = 1
    for index, (identity, field_name, code) in enumerate(compiled.steps):
        node = find_step(block, compiled, index, shapes_of)
        is_definition = identity.startswith(("def ", "class "))
        if node == "not found" and is_definition:
            return None
        where = _where(owner)
        if isinstance(node, str):
            return _Drifted(f"`{shapes.quoted(code)}` {node} in {where}", unit_node)
        if is_definition:
            unit_node = node
            position = block.index(node)
            if position:
                unit_first = _lines(block[position - 1])[1] + 1
            else:
                unit_first = _lines(owner)[0] + (0 if owner is tree else 1)
        if field_name == "header":
            return _Located(block, owner, unit_node, node, unit_first)
        inner = getattr(node, field_name, None)
        if not isinstance(inner, list) or not inner:
            return _Drifted(
                f"`{shapes.quoted(code)}` in {where} has no {field_name}", unit_node
            )
        block, owner = inner, node
    return _Located(block, owner, unit_node, None, unit_first)


def _documentation_riding(
    compiled: CompiledEdit, located: _Located, tree: ast.Module, shapes_of: ShapeCache
) -> tuple[Mapping[str, str], str, tuple[int, int] | None]:
    """A docstring or comments edit of a unit with code, in its block: its
    detail for the rewrite (what to write; empty: nothing), a note where the
    target's text is another, and the lines it writes (None: none)."""
    if compiled.edit.kind == "docstring":
        todo, note = docstrings.action(compiled, located.block)
        return docstrings.details_of(todo), note, None
    found = comments.action(compiled, located.block, comments.lines_of(tree), shapes_of)
    note = (
        f"its comments above {found.above} are not the ones the fix edits: "
        "left as they are"
        if found.todo is None
        else ""
    )
    return comments.details_of(found.todo), note, found.span if found.todo else None


def _still_reworded(unit: Unit, details: dict[str, Any]) -> str:
    """Where the unit's code is the fixed one and documentation it edits is
    still the old (a detail says what to write): the reason, with every
    other edit marked made (APPLIED_EDIT); else ``""``."""
    pending = {
        unit.edits[int(index)].kind
        for index, found in details.items()
        if unit.edits[int(index)].kind in DOCUMENTATION and found
    }
    if not pending:
        return ""
    for index, edit in enumerate(unit.edits):
        if edit.kind not in DOCUMENTATION:
            details[str(index)] = {APPLIED_EDIT: True}
    still = " and ".join(_REWORDED[kind] for kind in sorted(pending, reverse=True))
    if pending == {"docstring"}:
        return (
            f"its code is the fixed one; its {still} is still the one the fix rewords"
        )
    return f"its code is the fixed one; its {still} are still the ones the fix rewords"


def _documentation_span(located: _Located) -> tuple[int, int]:
    """The lines a documentation edit may rewrite: its definition's (the
    module's docstring alone, where it is the module's)."""
    if not isinstance(located.unit_node, ast.Module):
        return _lines(located.unit_node)
    block = located.block
    if block and shapes.is_docstring(block[0]):
        return block[0].lineno, block[0].end_lineno or block[0].lineno
    return 1, 1


def _documented(unit: Unit, located: _Located) -> str:
    """The definition whose docstring a documentation edit changes, as a
    reason names it."""
    match located.unit_node:
        case ast.Module():
            return f"the module {unit.path}"
        case ast.ClassDef(name=name):
            return f"class {name}"
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
            return f"def {name}"
    return unit.name


@dataclass
class _Drifted:
    """Why an edit's block is not found, and the definition it was looked
    for in (the module where it is a module's statement)."""

    reason: str
    unit_node: ast.AST


def _where(owner: ast.AST) -> str:
    match owner:
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
            return f"def {name}"
        case ast.ClassDef(name=name):
            return f"class {name}"
        case ast.Module():
            return "the module"
        case ast.stmt(lineno=line):
            return f"the block at line {line}"
    return "the block"


def _lines(node: ast.AST) -> tuple[int, int]:
    if isinstance(node, ast.Module):
        return 1, max((n.end_lineno or 1 for n in node.body), default=1)
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)])  # type: ignore[attr-defined]
    return first, node.end_lineno or first  # type: ignore[attr-defined]


def _recognise_edit(
    compiled: CompiledEdit,
    located: _Located,
    shapes_of: ShapeCache,
    unit_name: str,
) -> tuple[PatchState, str, tuple[int, int]]:
    span = _span(compiled, located)
    if compiled.edit.kind == "header":
        assert located.target is not None
        now = shapes.header(located.target)
        if now == compiled.header_before:
            return PatchState.NEEDED, "", span
        if now == compiled.header_after:
            return PatchState.APPLIED, "", span
        # A def's header is compared only in the parts the fix changes.
        found = _header_in_parts(compiled, located.target)
        if isinstance(found, PatchState):
            return found, "", span
        first = shapes.quoted(compiled.edit.header_before)
        return (
            PatchState.DRIFTED,
            f"the header of {unit_name} is neither the one the fix expects "
            f"(`{first}`) nor the fixed one{found}",
            span,
        )
    state, nothing = body_state(compiled, located.block, shapes_of)
    if state is not None:
        return state, "", span
    if nothing and _in_unit_once(compiled, located, shapes_of):
        return PatchState.APPLIED, "", span
    return PatchState.DRIFTED, _drift_reason(compiled, located, shapes_of), span


def _recognise_entry(
    compiled: CompiledEdit, located: _Located, unit_kind: str
) -> tuple[PatchState, str, tuple[int, int], int] | None:
    """An entry edit's state, its span and the line of its entries (see
    :mod:`.entries`); None where the unit is an entry of a literal of the
    module or a class and no statement there binds the literal's name."""
    pattern = compiled.entries
    assert pattern is not None
    where = _where(located.owner)
    found = entries.holders(pattern, located.block)
    if len(found) != 1:
        named = [n for n in located.block if entries.bound_name(n) == pattern.name]
        if not found and unit_kind == "entry" and pattern.name and not named:
            return None
        if found:
            reason = f"{pattern.what()} found {len(found)} times in {where}"
        elif named:
            reason = (
                f"{pattern.what()} in {where} is not the statement the fix "
                f"expects, its entries aside (`{shapes.quoted(pattern.prefix)}`)"
            )
        else:
            reason = f"`{shapes.quoted(pattern.prefix)}` not found in {where}"
        return PatchState.DRIFTED, reason, _span(compiled, located), 0
    statement, container = found[0]
    held = entries.entries_of(container)
    state, start, _, why = entries.where_in(pattern, held)
    line = held[start].first if start < len(held) else statement.lineno
    span = _span(compiled, located)
    if isinstance(located.unit_node, ast.Module | ast.ClassDef):
        span = _lines(statement)
    return PatchState(state), why, span, line


def _header_in_parts(compiled: CompiledEdit, target: ast.stmt) -> PatchState | str:
    """A def header's state compared in the parts the fix changes
    (:mod:`.signature`); else what of the change the target lacks, as the
    end of a reason (empty for another statement)."""
    before = signature.recorded(compiled.edit.header_before)
    after = signature.recorded(compiled.edit.header_after)
    now = signature.of(target)
    if before is None or after is None or now is None:
        return ""
    found = signature.state(before, after, now)
    if isinstance(found, PatchState):
        return found
    return f", in {found}"


def _in_unit_once(
    compiled: CompiledEdit, located: _Located, shapes_of: ShapeCache
) -> bool:
    """Whether the fix's statements are in another block of the unit (upstream
    may have wrapped them since, in a ``with`` or an ``if``): found together
    exactly once in the whole unit, and the removed statements nowhere in it."""
    if not compiled.inserted or isinstance(located.unit_node, ast.Module):
        return False
    blocks = list(shapes.blocks_of(located.unit_node))
    found = sum(
        len(occurrences(block, compiled.inserted, False, False, shapes_of))
        for block in blocks
    )
    removed = (
        sum(
            len(occurrences(block, compiled.removed, False, False, shapes_of))
            for block in blocks
        )
        if compiled.removed
        else 0
    )
    return found == 1 and removed == 0


def _drift_reason(
    compiled: CompiledEdit, located: _Located, shapes_of: ShapeCache
) -> str:
    """Which statement of the code the fix expects is missing or repeated."""
    where = _where(located.owner)
    statements = shapes.without_docstring(located.block)
    for key in compiled.before_pattern:
        count = sum(key.matches(node, shapes_of) for node in statements)
        if count != 1:
            times = "not found" if count == 0 else f"found {count} times"
            return f"`{shapes.quoted(key.code)}` {times} in {where}"
    if compiled.inserted and all(
        any(key.matches(node, shapes_of) for node in statements)
        for key in compiled.inserted
    ):
        return f"both the code the fix replaces and the fixed code are in {where}"
    around = (
        [k for k in (compiled.before_anchor, compiled.after_anchor) if k]
        if compiled.anchored
        else []
    )
    return (
        f"the statements of the fix in {where} are not where the fix expects "
        "them (" + ", ".join(f"`{shapes.quoted(k.code)}`" for k in around) + ")"
        if around
        else f"the statements the fix replaces in {where} are not together "
        "or not in its order"
        if not compiled.anchored
        else f"the statements of the fix are not the whole block of {where}"
    )


def _span(compiled: CompiledEdit, located: _Located) -> tuple[int, int]:
    """The lines a rewrite of this edit may touch: the unit's definition, or
    for a change in a class or the module, the block around the edit."""
    if not isinstance(located.unit_node, ast.Module | ast.ClassDef) or (
        located.target is not None
    ):
        # In a function, the whole definition, whatever the edit changes
        # there: the rewrite may write the fixed definition whole (rewrite.py).
        node = located.unit_node
        if isinstance(node, ast.Module | ast.ClassDef):
            node = located.target
        return min(located.unit_first, _lines(node)[0]), _lines(node)[1]
    # In a class's or the module's block: from the owner's header (or the
    # first statement) to the block's end. Wide, but only whole statements
    # matched by the pattern are ever replaced.
    block = located.block
    if not block:  # an empty module (a package's bare __init__.py)
        return 1, 1
    first = _lines(block[0])[0]
    if isinstance(located.owner, ast.stmt):
        first = _lines(located.owner)[0]
    return first, _lines(block[-1])[1]


def load_derived(path: Path, agreement: list[Agreement] | None = None) -> DerivedPatch:
    """Read one data file; a broken one is a DeepstackError naming it, and
    so is one whose edits do not turn a unit's ``before`` into its ``after``
    (:mod:`.truth`). With ``agreement``, that check is the caller's: the
    file's units, path and bytes go into it (a folder's files are checked
    together: :func:`.truth.refuse_disagreements`)."""
    from deepstack_patch.engine.derived.truth import refuse_disagreement

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DeepstackError(
            f"cannot read: {exc}", BROKEN_HINT, path=str(path)
        ) from None
    patch = DerivedPatch(**read_fields(path, data))
    try:
        for unit in patch.units:  # every recorded piece of code must parse
            for edit in unit.edits:
                patch._compile(edit)
    except (SyntaxError, ValueError) as exc:
        raise DeepstackError(
            f"not a derived patch: recorded code does not parse: {exc}",
            BROKEN_HINT,
            path=str(path),
        ) from None
    if agreement is None:
        refuse_disagreement(patch.units, path, data)
    else:
        agreement.append((patch.units, path, data))
    # The file's bytes are its data: no need to write it out again to key
    # the caches on it (0.7 s of 40 data files, in a profile).
    patch._fingerprint = hashlib.sha256(data).digest()
    return patch


def _first_newline(text: str) -> str:
    """The file's newline as LibCST reads it: the first one in the text."""
    match re.search(r"\r\n?|\n", text):
        case None:
            return "\n"
        case found:
            return found.group()


def _declares_another_encoding(code: bytes) -> bool:
    """A coding line (PEP 263) in the first two lines naming another
    encoding than UTF-8."""
    for line in code.splitlines()[:2]:
        if declared := re.match(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", line):
            return declared.group(1).lower().replace(b"_", b"-") not in (
                b"utf-8",
                b"utf8",
            )
    return False

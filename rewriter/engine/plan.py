"""Plan a series on a tree: every patch's state, and every file's new bytes.

Nothing is written here. Each candidate file is read once; its CPython ast is
built once per distinct content; the file is handed to every patch that
touches it, in series order, so a patch sees the code as the patches before it
left it. A patch that reads other files of the tree (a derived patch: the
names its fix imports, what it reads at run time) sees them as the patches
before it left them too: the series is planned in segments, each beginning
at such a patch, and what a segment rewrote is laid over the tree the next
one reads (:mod:`deepstack_patch.engine.context`). A rewrite is kept only if
the patch recognises its own output as ``applied`` and the change stays
inside the lines its findings claimed.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from deepstack_patch.engine.context import note_source, recognising_in, tree_context
from deepstack_patch.engine.errors import DeepstackError, RewriteRefused
from deepstack_patch.engine.protocol import (
    Finding,
    Location,
    Patch,
    PatchReport,
    PatchState,
)
from deepstack_patch.engine.reading import (
    check_inside,
    read_candidate,
    refuse_unrecognised_tree,
)
from deepstack_patch.engine.recognition_cache import RecognitionCache
from deepstack_patch.engine.requirements import Selection, block_unmet_requirements
from deepstack_patch.engine.series import series_segments
from deepstack_patch.engine.source import SourceFile, code_lines, keeping_parses
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.engine.whole import refuse_partial_patches
from deepstack_patch.engine.whole_files import plan_missing_files


@dataclass
class FileEdit:
    """The new content of one file, with the patches that changed it.

    ``stages`` holds the file as each of those patches left it, in series
    order (the last is ``new``): per-patch outputs (a quilt series, one commit
    per patch) are cut from it without planning the series again.
    """

    relpath: str
    old: bytes
    new: bytes
    patch_ids: list[str] = field(default_factory=list)
    stages: list[tuple[str, bytes]] = field(default_factory=list, compare=False)
    #: ``change``, ``add`` (created: ``old`` is b"") or ``delete`` (``new`` b"").
    action: str = "change"


@dataclass
class Plan:
    tree: VllmTree
    reports: list[PatchReport]
    edits: list[FileEdit]

    @property
    def needed(self) -> list[PatchReport]:
        return [r for r in self.reports if r.selected and r.state is PatchState.NEEDED]

    def report(self, patch_id: str) -> PatchReport:
        return next(r for r in self.reports if r.patch.id == patch_id)


def select_patches(
    series: Sequence[Patch], only: Sequence[str] = (), skip: Sequence[str] = ()
) -> Selection:
    """The ids chosen by ``--only`` and ``--skip``; unknown ids are an error."""
    known = {patch.id for patch in series}
    for option, ids in (("--only", only), ("--skip", skip)):
        for patch_id in ids:
            if patch_id not in known:
                raise _unknown_id(patch_id, series, option)
    chosen = Selection((set(only) if only else set(known)) - set(skip), only, skip)
    if not chosen:
        # A gate that checks nothing must not pass: an empty selection is a
        # mistake in the command line, never "nothing to do".
        raise DeepstackError(
            "the selection is empty: --only and --skip leave no patch",
            "drop a --skip, or choose with --only from: "
            + ", ".join(patch.id for patch in series),
        )
    return chosen


def _unknown_id(
    patch_id: str, series: Sequence[Patch], option: str = "--only"
) -> DeepstackError:
    """No patch has ``patch_id`` (given to ``option``): ids joined by commas
    where the option takes one; with the built-in series alone, the likely
    cause is a derived patch whose folder was not given."""
    ids = ", ".join(sorted(patch.id for patch in series))
    pieces = [piece.strip() for piece in patch_id.split(",")]
    if len(pieces) > 1 and {patch.id for patch in series}.issuperset(pieces):
        return DeepstackError(
            f"unknown patch id {patch_id!r}: {option} takes one id",
            "repeat the option, one id each: "
            + " ".join(f"{option} {piece}" for piece in pieces),
        )
    if all(patch.origin == "built-in" for patch in series):
        return DeepstackError(
            f"unknown patch id {patch_id!r}: the series holds only the "
            "built-in patches",
            "a derived patch (or a patch module) joins the series with "
            "--patches DIR, the folder `derive --out` wrote; the built-in ids: " + ids,
        )
    return DeepstackError(
        f"unknown patch id {patch_id!r}",
        f"choose from: {ids} (see 'deepstack-patch list')",
    )


def plan_tree(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str] | None = None,
    *,
    rewrite: bool = True,
    progress: Callable[[str], None] | None = None,
    cache: RecognitionCache | None = None,
) -> Plan:
    """Recognise every patch of ``series`` in ``tree`` and compute the rewrites.

    With ``rewrite=False`` (status, ``apply --check``) nothing is rewritten:
    every patch is recognised on the file as the tree has it, and a patch
    that requires another (see ``Patch.requires``) recognises its target on
    the shape before that requirement's rewrite as well as after it. The
    exception is a needed patch that reads the tree (a derived one) with
    another such patch after it: its rewrite is computed, never returned,
    so that the later one is judged on the code as ``apply`` would leave it.

    With a ``cache`` (see :mod:`deepstack_patch.engine.cache`) a file whose
    exact bytes were recognised before by the same code is not parsed again,
    unless a patch is to be rewritten in it; and a plan that rewrites nothing,
    of a series with a patch that reads the tree, is kept whole, and given
    again while no file it could read has changed (:mod:`.plan_memo`).
    """
    if selected is None:
        selected = {patch.id for patch in series}
    reads_tree = any(getattr(p, "reads_tree", False) for p in series)
    with _ahead_of_plan(tree, series):
        memo = None
        # Kept whole only where it rewrites nothing and a patch reads the tree
        # (else the per-file cache does all a kept plan would, for less).
        if cache is not None and not rewrite and reads_tree:
            from deepstack_patch.engine.plan_memo import PlanMemo

            memo = PlanMemo.for_plan(tree, series, selected, cache)
            kept = memo.load(series)
            if kept is not None:
                return Plan(tree=tree, reports=kept, edits=[])
        started = time.time()
        # Recognition may read other files of the tree (a derived patch checks
        # the names its fix imports: engine/derived/names.py), as the earlier
        # patches leave them, and rewrites a file to check it (runtime.py).
        with (
            _without_cycle_collection(),
            keeping_parses(),
            recognising_in(tree.root, series, selected, rewritten_bytes) as context,
        ):
            context.hashed = memo.hashed if memo is not None else {}
            # A check may put its work off to the pass's end, to do it once for
            # every patch (ty over all the files that need it), answering
            # meanwhile as if it found nothing; where it found something, the
            # series is planned again with its answers (a drifted patch writes
            # nothing a later one could read). The last pass puts nothing off.
            # A file is shown once, whatever the passes.
            progress = _each_once(progress) if progress else None
            for last in [False] * _DEFERRING_PASSES + [True]:
                context.defer_checks = not last
                plan = _plan(tree, series, selected, rewrite, progress, cache)
                if restated := _restated(plan):
                    # A patch whose parts were restated after its rewrite was
                    # computed (not applicable: engine/whole.py) writes nothing,
                    # and no later patch reads what it would have written.
                    context.start_again()
                    plan = _plan(
                        tree, series, selected, rewrite, progress, cache,
                        rewriting=selected - restated,
                    )  # fmt: skip
                if memo is not None and context.deferred and not context.unsettled:
                    # What a kept plan reads of the package is read while ty
                    # finishes the checks this pass put off.
                    memo.prepare(context)
                # Every piece of work is run, so none is left behind.
                again = [work.run() for work in context.deferred.values()]
                if not any(again):
                    break
                context.start_again()
            if memo is not None and not plan.edits:
                memo.store(plan.reports, context, started)
            return plan


@contextlib.contextmanager
def _ahead_of_plan(tree: VllmTree, series: Sequence[Patch]) -> Iterator[None]:
    """The work the series' patches start as a plan starts (each kind's
    ``ahead_of_plan`` once), for the plan's length; before a kept plan is
    looked for, which reads every file."""
    with contextlib.ExitStack() as ahead:
        for start in {getattr(p, "ahead_of_plan", None) for p in series} - {None}:
            ahead.enter_context(start(tree.root))  # type: ignore[misc]
        yield


def _each_once(progress: Callable[[str], None]) -> Callable[[str], None]:
    """``progress`` called once for each file, however often it is read."""
    shown: set[str] = set()

    def show(relpath: str) -> None:
        if relpath not in shown:
            shown.add(relpath)
            progress(relpath)

    return show


#: How many passes of the plan may put checks off: one as a rule; another
#: where a drift the first found changed what a later patch reads.
_DEFERRING_PASSES = 3


@contextlib.contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """Pause Python's cycle collector while trees are built.

    Parsing a 3000-line file makes a few hundred thousand ast and LibCST
    nodes, and every allocation burst triggered a collection that walked all
    live objects: a third of a plan's time. The trees are freed by reference
    counting; any cycle left is collected after the plan, as before.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # What the plan made and still holds would all be young, and the
        # first collection after it would walk it all (a third of a second
        # after a first status of 40 derived fixes): counted old at once,
        # it waits for a full collection, which finds any cycle among it.
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()


def _restated(plan: Plan) -> set[str]:
    """The patches that rewrote a file of the plan although their report,
    once every part was judged together, is no longer needed: applied or not
    applicable (engine/whole.py: what is there of a fix only serves what
    is not). A drifted one is refused whole by apply (and left out whole by
    ``--skip-drifted``)."""
    done = (PatchState.APPLIED, PatchState.NOT_APPLICABLE)
    return {
        patch_id
        for edit in plan.edits
        for patch_id in edit.patch_ids
        if plan.report(patch_id).state in done
    }


def _plan(
    tree: VllmTree,
    series: Sequence[Patch],
    selected: set[str],
    rewrite: bool,
    progress: Callable[[str], None] | None,
    cache: RecognitionCache | None,
    rewriting: set[str] | None = None,
) -> Plan:
    """One pass over the series: the selected patches' reports, and the
    rewrites of those in ``rewriting`` (the selected ones by default)."""
    rewriting = selected if rewriting is None else rewriting
    reports = {p.id: PatchReport(patch=p, selected=p.id in selected) for p in series}
    # Patches often share their globs (every model file): walk each pattern once.
    globbed: dict[str, list[str]] = {}
    for pattern in dict.fromkeys(pat for p in series for pat in p.paths):
        globbed[pattern] = tree.glob((pattern,))
    refuse_unrecognised_tree(tree, globbed)
    files_of = {
        p.id: {rel for pattern in p.paths for rel in globbed[pattern]} for p in series
    }
    for patch in series:  # where a part's file is absent, its report says so
        reports[patch.id].tree_files = frozenset(files_of[patch.id])
    planning = _Planning(tree, files_of, reports, rewriting, cache, progress)
    segments = series_segments(series)
    for index, segment in enumerate(segments):
        # Status computes a derived patch's rewrite only where one reads it.
        planning.plan_segment(segment, rewrite, index < len(segments) - 1)
    for missing in plan_missing_files(series, files_of, rewriting, rewrite):
        for patch_id, locations in missing.locations.items():
            reports[patch_id].locations += locations
        if missing.stages:  # created, as its last stage left it
            planning.edits[missing.relpath] = FileEdit(
                missing.relpath, b"", *missing.created, "add"
            )

    block_unmet_requirements(reports, selected)
    refuse_partial_patches(reports)
    return Plan(tree=tree, reports=list(reports.values()), edits=planning.all_edits())


@dataclass
class _Planning:
    """A series being planned, segment by segment (:func:`series_segments`):
    each file as the segments so far left it, and the edits so far."""

    tree: VllmTree
    files_of: dict[str, set[str]]
    reports: dict[str, PatchReport]
    selected: set[str]
    cache: RecognitionCache | None
    progress: Callable[[str], None] | None
    #: The files the segments so far rewrote, as they left them.
    current: dict[str, SourceFile] = field(default_factory=dict)
    edits: dict[str, FileEdit] = field(default_factory=dict)
    real_dirs: dict[str, str] = field(default_factory=dict)

    def plan_segment(
        self, patches: list[Patch], rewrite: bool, read_later: bool
    ) -> None:
        """Recognise (and with ``rewrite`` rewrite) ``patches`` in their files;
        lay what they rewrote over the tree the next segment reads.
        ``read_later``: a later segment reads the tree, so a needed patch
        that reads it too is rewritten even without ``rewrite``, and a file
        a drifted patch rewrote in part is read there as it was (``apply``
        writes nothing of it)."""
        root = str(self.tree.root)
        edits: list[FileEdit] = []
        for relpath in sorted(set().union(*(self.files_of[p.id] for p in patches))):
            touching = [p for p in patches if relpath in self.files_of[p.id]]
            source = self.current.get(relpath) or SourceFile(
                relpath, read_candidate(root, relpath)
            )
            # Patches share markers (vllm#40932 and vllm#43617): search each once.
            markers = {m for p in touching for m in p.markers}
            present = {m: m in source.raw for m in markers}
            touching = [p for p in touching if any(present[m] for m in p.markers)]
            if not touching:
                continue
            # Only files a patch may rewrite must live inside the tree; checking
            # just these keeps a status run to one realpath per folder.
            check_inside(self.tree, relpath, self.real_dirs)
            if self.progress:
                self.progress(relpath)
            found, edit = _plan_file(
                source, touching, self.selected, rewrite, self.cache, read_later
            )
            for patch, findings in zip(touching, found, strict=True):
                self.reports[patch.id].locations.extend(
                    Location(relpath, f) for f in findings
                )
            edits += [edit] if edit is not None else []
        drifted = {
            p.id
            for p in patches
            if read_later
            and any(
                loc.state is PatchState.DRIFTED for loc in self.reports[p.id].locations
            )
        }
        kept = [edit for edit in edits if not drifted.intersection(edit.patch_ids)]
        for edit in kept:
            self.current[edit.relpath] = SourceFile(edit.relpath, edit.new)
            if rewrite:  # else computed for a later segment only
                self._add(edit)
        context = tree_context()
        if context is not None:
            context.lay_over({edit.relpath: edit.new for edit in kept})

    def _add(self, edit: FileEdit) -> None:
        """``edit`` after what the earlier segments did to its file."""
        earlier = self.edits.get(edit.relpath)
        if earlier is not None:
            edit = FileEdit(
                edit.relpath,
                earlier.old,
                edit.new,
                [*earlier.patch_ids, *edit.patch_ids],
                [*earlier.stages, *edit.stages],
                edit.action,
            )
        self.edits[edit.relpath] = edit

    def all_edits(self) -> list[FileEdit]:
        return [e for _, e in sorted(self.edits.items()) if e.new != e.old]


def _plan_file(
    original: SourceFile,
    touching: list[Patch],
    selected: set[str],
    rewrite: bool,
    cache: RecognitionCache | None,
    read_later: bool = False,
) -> tuple[list[list[Finding]], FileEdit | None]:
    """Each touching patch's findings in one file, and the file's edit. With
    ``read_later`` and without ``rewrite`` (status, before a patch that reads
    the tree) a needed patch that reads the tree is rewritten for that later
    patch only: its findings stay what recognition said."""
    relpath = original.relpath
    if any(getattr(patch, "reads_tree", False) for patch in touching):
        cache = None  # the findings depend on more than the file's bytes
    if cache is not None:
        cached = cache.load(relpath, original.raw, touching)
        if cached is not None and not (
            rewrite
            and any(
                f.state is PatchState.NEEDED and patch.id in selected
                for patch, findings in zip(touching, cached, strict=True)
                for f in findings
            )
        ):
            return cached, None
    current = original
    changed_by: list[str] = []
    stages: list[tuple[str, bytes]] = []
    found: list[list[Finding]] = []
    rewritten = deleted = False
    for patch in touching:
        if deleted:  # the patches after the one that deletes it see it absent
            found.append(patch.recognise_missing(relpath))
            continue
        reads_tree = getattr(patch, "reads_tree", False)
        if reads_tree:
            note_source(relpath, current.raw)  # what its runtime check rewrites
        findings = patch.recognise(current.ast, relpath)
        needed = [f for f in findings if f.state is PatchState.NEEDED]
        # Without writing nothing is rewritten (a patch that requires
        # another also recognises its target on the shape before the
        # requirement's rewrite), but for a derived patch a later one reads.
        if needed and patch.id in selected and (rewrite or read_later and reads_tree):
            rewritten = True
            # A whole file the patch adds or deletes, needed where it is: gone.
            deleted = relpath in patch.whole_files
            try:
                current = _rewrite(patch, current, needed, deleted)
                changed_by.append(patch.id)
                stages.append((patch.id, current.raw))
            except RewriteRefused as refusal:
                if rewrite:
                    findings = [
                        _as_drifted(f, str(refusal)) if f in needed else f
                        for f in findings
                    ]
        found.append(findings)
    if cache is not None and not rewritten:
        cache.store(relpath, original.raw, touching, found)
    if deleted or (changed_by and current.raw != original.raw):
        action = "delete" if deleted else "change"
        edit = FileEdit(relpath, original.raw, current.raw, changed_by, stages, action)
        return found, edit
    return found, None


def rewrite_text(patch: Patch, text: str, relpath: str = "example.py") -> str:
    """Run one patch over one piece of source, as the engine would in a tree.

    Returns the text unchanged when nothing is needed. Raises
    :class:`RewriteRefused` when the rewrite is not accepted. The example
    harness and the unit tests use this.
    """
    source = SourceFile(relpath, text.encode())
    needed = [
        f for f in patch.recognise(source.ast, relpath) if f.state is PatchState.NEEDED
    ]
    if not needed:
        return text
    return _rewrite(patch, source, needed).text


#: Set to "1" to give every patch the whole module (the skeleton's reference).
FULL_REWRITE_ENV = "DEEPSTACK_PATCH_FULL_REWRITE"

#: Lines of a file a rewrite replaced: 0-based ``[start, end)`` ranges of the
#: original lines (``start == end`` for an insertion before line ``start``).
Changes = list[tuple[int, int]]


@dataclass
class SkeletonRewrite:
    """A rewrite computed on a skeleton, mapped back onto the whole file."""

    result: SourceFile
    changed: Changes


def _rewrite(
    patch: Patch, source: SourceFile, needed: list[Finding], deleted: bool = False
) -> SourceFile:
    """Apply one patch to one file and prove the result is what it claims.

    The patch first rewrites a skeleton of the file (see :func:`_skeleton`):
    parsing, visiting and printing a whole 3000-line model file with LibCST
    costs seconds, its target definitions a fraction of that. Any trouble
    there (a parse error, a rewrite that raises or that the checks refuse)
    falls back to the whole module, whose result is authoritative.
    """
    if deleted:  # a file the patch deletes whole: nothing is left
        return SourceFile(source.relpath, b"")
    # A derived patch's typed check rewrote the file already to read it
    # fixed (:func:`rewritten_bytes`): the plan takes that rewrite. (A
    # finding's ``line`` is where a report points, never what is written.)
    # Keyed by the file's bytes, a rewrite holds for the whole plan.
    context = tree_context()
    done: dict[object, object] = {} if context is None else context.on_disk
    key = (
        "rewrite",
        id(patch),
        source.relpath,
        source.raw,
        repr(
            [(f.state, f.symbol, f.span, f.part, f.rewrites, f.details) for f in needed]
        ),
    )
    if (found := done.get(key)) is not None and found[0] is patch:  # type: ignore[index]
        return found[1]  # type: ignore[index]
    result = _rewritten(patch, source, needed)
    done[key] = patch, result  # with the patch: an ``id`` reused never hits
    return result


def _rewritten(patch: Patch, source: SourceFile, needed: list[Finding]) -> SourceFile:
    if os.environ.get(FULL_REWRITE_ENV) != "1":
        try:
            fast = _rewrite_skeleton(patch, source, needed)
            if fast is not None:
                return _checked(patch, source, needed, fast.result, fast.changed)
        except Exception:  # noqa: BLE001 - the whole module decides below
            pass
        # A derived patch edits text: the whole file's, where no skeleton
        # leaves anything out (a small file), without a LibCST module.
        as_text = getattr(patch, "rewrite_text", None)
        written = as_text(source.raw, needed) if as_text else None
        if written is not None:
            result = SourceFile(source.relpath, written)
            changed = _changed_lines(source, result)
            return _checked(patch, source, needed, result, changed)
    module = patch.rewrite(source.cst, needed)
    result = SourceFile.from_cst(source.relpath, module)
    return _checked(patch, source, needed, result, _changed_lines(source, result))


def rewritten_bytes(
    patch: Patch, relpath: str, raw: bytes, needed: list[Finding]
) -> bytes:
    """The bytes ``apply`` would write for ``patch`` in ``relpath``: for a
    check that reads the fixed file before anything is written (a derived
    patch's runtime names). :class:`RewriteRefused` where it refuses."""
    return _rewrite(patch, SourceFile(relpath, raw), needed).raw


def _checked(
    patch: Patch,
    source: SourceFile,
    needed: list[Finding],
    result: SourceFile,
    changed: Changes,
) -> SourceFile:
    """``result`` if the patch recognises it applied and it changed no more."""
    _check_edits_inside(source, changed, needed)
    try:
        after = patch.recognise(result.ast, source.relpath)
    except DeepstackError as exc:
        raise RewriteRefused(f"the rewrite does not parse: {exc}") from None
    for finding in needed:
        states = [
            f.state
            for f in after
            if f.symbol == finding.symbol and f.part == finding.part
        ]
        if states != [PatchState.APPLIED]:
            raise RewriteRefused(
                f"after the rewrite {finding.symbol} is "
                f"{', '.join(map(str, states)) or 'gone'}, not applied"
            )
    return result


_PLACEHOLDER = b"# deepstack-patch skeleton block %d\n"

#: A skeleton: its lines, and for each the 0-based range of file lines it
#: stands for.
Skeleton = tuple[list[bytes], list[tuple[int, int]]]


def _skeleton(source: SourceFile, needed: list[Finding]) -> Skeleton | None:
    """The file reduced to the definitions the needed spans touch.

    Every module-level or class-level statement no needed span touches is
    left out (a class a span touches keeps its header and the statements
    the span touches); each run of left-out lines becomes one unique comment
    line, so a line diff of the skeleton before and after the rewrite maps
    back onto the file. Patches address code by name, never by line number,
    in ``rewrite`` (line numbers differ in the skeleton).
    """
    if source.encoding != "utf-8" or source.raw.startswith(b"\xef\xbb\xbf"):
        return None
    original = source.raw.splitlines(keepends=True)
    spans = [f.span for f in needed]
    dropped = _untouched_statements(source.ast.body, spans, original)
    if not dropped:
        return None
    lines: list[bytes] = []
    origin: list[tuple[int, int]] = []
    position = 0
    for first, last in dropped:  # 1-based, inclusive, sorted, disjoint
        for index in range(position, first - 1):
            lines.append(original[index])
            origin.append((index, index + 1))
        lines.append(_PLACEHOLDER % len(lines))
        origin.append((first - 1, last))
        position = last
    for index in range(position, len(original)):
        lines.append(original[index])
        origin.append((index, index + 1))
    return lines, origin


def _untouched_statements(
    body: list[ast.stmt], spans: list[tuple[int, int]], lines: list[bytes]
) -> list[tuple[int, int]] | None:
    """The 1-based line ranges of ``body``'s statements (recursively into the
    classes a span touches) that no span touches. Consecutive ones merge,
    with the blank and comment lines between them. None if nothing would be
    left out, or if a left-out statement shares a line with kept code."""

    def starts_line(node: ast.stmt, first: int) -> bool:
        column = node.col_offset if first == node.lineno else 0
        return not lines[first - 1][:column].strip()

    def prune(statements: list[ast.stmt]) -> list[tuple[int, int]] | None:
        found: list[tuple[int, int]] = []
        kept = False
        previous_end, previous_untouched = 0, False
        for node in statements:
            first, last = _lines_of(node)
            # Lines 1-2 may hold an encoding declaration: never replaced.
            untouched = first > 2 and not any(
                a <= last and first <= b for a, b in spans
            )
            if untouched and not starts_line(node, first):
                raise _SharedLine
            if first == previous_end and untouched != previous_untouched:
                raise _SharedLine
            if untouched and previous_untouched:
                found[-1] = (found[-1][0], last)
            elif untouched:
                found.append((first, last))
            else:
                kept = True
                if isinstance(node, ast.ClassDef):
                    found.extend(prune(node.body) or [])
            previous_end, previous_untouched = last, untouched
        return found if kept else None

    try:
        return prune(body)
    except _SharedLine:
        return None


class _SharedLine(Exception):
    """A statement to leave out shares a line with one to keep."""


def _lines_of(node: ast.stmt) -> tuple[int, int]:
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)])
    return first, node.end_lineno or node.lineno


def _rewrite_skeleton(
    patch: Patch, source: SourceFile, needed: list[Finding]
) -> SkeletonRewrite | None:
    # Imported by a rewrite only: recognition (status, --check) needs it not.
    import difflib

    skeleton = _skeleton(source, needed)
    if skeleton is None:
        return None
    before, origin = skeleton
    # A derived patch edits text: it needs no module parsed and printed
    # (nor LibCST loaded).
    as_text = getattr(patch, "rewrite_text", None)
    written = as_text(b"".join(before), needed) if as_text else None
    if written is None:
        import libcst

        written = patch.rewrite(libcst.parse_module(b"".join(before)), needed).bytes
    after = written.splitlines(keepends=True)
    original = source.raw.splitlines(keepends=True)
    out: list[bytes] = []
    changed: Changes = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for start, end in origin[i1:i2]:
                out.extend(original[start:end])
            continue
        # A rewrite that moved or dropped a left-out block is not a local edit.
        if any(line.startswith(b"# deepstack-patch") for line in before[i1:i2]) or any(
            line.startswith(b"# deepstack-patch") for line in after[j1:j2]
        ):
            return None
        start = origin[i1][0] if i1 < len(origin) else len(original)
        end = origin[i2 - 1][1] if i2 > i1 else start
        changed.append((start, end))
        out.extend(after[j1:j2])
    first_changed = min(start for start, _ in changed) if changed else len(original)
    return SkeletonRewrite(source.edited(b"".join(out), first_changed), changed)


def _changed_lines(before: SourceFile, after: SourceFile) -> Changes:
    """The ranges of ``before``'s lines a line diff replaces to give ``after``."""
    old_lines = code_lines(before.text)
    new_lines = code_lines(after.text)
    import difflib

    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    return [(i1, i2) for tag, i1, i2, _, _ in matcher.get_opcodes() if tag != "equal"]


def _check_edits_inside(
    before: SourceFile, changed: Changes, needed: list[Finding]
) -> None:
    """Refuse a rewrite that touched lines no needed finding claimed (an
    insertion after blank lines also counts where they begin: vllm#35219)."""
    lines = before.raw.splitlines()
    for i1, i2 in changed:
        first, last = i1 + 1, max(i2, i1 + 1)
        gap = i1 if i1 == i2 else -1
        while 0 < gap <= len(lines) and not lines[gap - 1].strip():
            gap -= 1
        places = ((first, last), (gap + 1, gap + 1))
        if not any(
            f.span[0] <= a and b <= f.span[1] + 1 for f in needed for a, b in places
        ):
            raise RewriteRefused(
                f"the rewrite changed {before.relpath}:{first}-{last}, outside "
                f"the recognised target(s) "
                + ", ".join(
                    f"{f.symbol} (lines {f.span[0]}-{f.span[1]})" for f in needed
                )
            )


def _as_drifted(finding: Finding, reason: str) -> Finding:
    return Finding(
        state=PatchState.DRIFTED,
        symbol=finding.symbol,
        line=finding.line,
        span=finding.span,
        reason=reason,
        part=finding.part,
        rewrites=finding.rewrites,
    )

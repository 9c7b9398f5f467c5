"""Whether the code a derived patch writes can run in its target: the
attributes its new code reads exist there (issue 34, item 1).

:mod:`.names` checks the names a fix reads from its file and from ``vllm``
modules (and, for a module whose ``__getattr__`` answers declared names
only, as ``vllm.envs`` does, that the name is declared). What it cannot see
is an attribute of an object: ``model_config.is_diffusion`` on a release
whose ``ModelConfig`` has no such field fails only at run time. Two checks
here, for a unit that is otherwise ``needed``:

- **defined nowhere**: an attribute the fix newly reads (its removed code
  did not) whose name the release's ``vllm`` package neither defines (an
  assignment to it, a ``def``, a class, a field, a keyword, a string of
  that name) nor reads as an attribute anywhere. This covers what nothing
  types: ``self.model.fc_norm`` on a ``torch.nn.Module``, whose
  ``__getattr__`` answers any name to a type checker.
- **typed**: the type checker ``ty`` (vLLM configures it, ``[tool.ty]``) on
  the file as the fix leaves it and as it is, in the tree (the fixed file
  in a folder of links to the tree's others). A diagnostic of a kind that
  means "cannot run" (:data:`CANNOT_RUN`) on a line the fix wrote, that the
  file as it is does not have, makes the unit drift with ty's words. The
  third-party packages (torch above all) are absent, so their types are
  unknown, and unknown is never an error.

Both read the package as the earlier patches of the series leave it
(:mod:`deepstack_patch.engine.context`: a name vllm#48879 adds is there for
vllm#50358 after it). Neither refuses a name that is there at run time from
outside vLLM: an attribute a class inherits from the standard library or a
dependency, or one ty misses on an open interface (a ``Protocol``):
:mod:`.outside`.

Both need the release's whole ``vllm`` package; where the tree cannot tell
(a partial extraction not asked for it: a derived patch asks, ``also_reads``)
they are not run, never guessed, and the needed part says so (``apply``
writes it only with ``--unchecked-names``, issue 40, item 7). ty is run
by :mod:`.typecheck`, and the typed check's verdict is cached
(``runtime-names/`` in the cache folder, :mod:`.typecheck` too) under a
digest of everything it depends on: the file, every ``vllm`` module ty can
reach from it or from the fix's code (:mod:`.closure`, as the earlier
patches leave them), the patch's data, this package's code and ty's
version. An edit to a module outside that closure keeps the verdict. The
"defined nowhere" check is not cached: it reads the whole package, in
memory, once per state of the series.

Nothing here runs for a hand-written patch, or without a tree (a patch's
examples, ``rewrite_text``).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import os
import re
from collections import ChainMap, Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepstack_patch.engine.context import TreeContext, tree_context
from deepstack_patch.engine.derived import (
    closure,
    import_lists,
    outside,
    typecheck,
    verdicts,
)
from deepstack_patch.engine.derived.data import Unit
from deepstack_patch.engine.derived.match import code_nodes, import_aliases
from deepstack_patch.engine.derived.names import (
    DerivedPatch,
    added_imports,
    imports_in,
)
from deepstack_patch.engine.protocol import Finding, PatchState
from deepstack_patch.engine.source import parsed

#: ty's rules that mean the code cannot run: an attribute, a module member,
#: a name or a ``vllm`` import that is not there, an argument the callee
#: does not take or a required one not given. ``possibly-*`` rules (a union
#: one member of which lacks it) and type mismatches are not among them.
CANNOT_RUN = frozenset(
    {
        "missing-attribute",
        "missing-module-member",
        "unresolved-reference",
        "unresolved-global",
        "import-not-found",
        "unknown-argument",
        "missing-argument",
        "too-many-positional-arguments",
        "parameter-already-assigned",
    }
)

#: The key of a drifted finding's details that says the drift is this
#: module's (what the fix reads at run time is not there).
RUNTIME = "runtime_names"

#: The key of a needed finding's details that says what its code reads at
#: run time was not checked: the tree is this tool's partial extraction,
#: without the release's whole ``vllm`` package.
UNCHECKED = "runtime_names_unchecked"

#: Why (``details[UNCHECKED]``), and the needed part's reason.
UNCHECKED_WHY = "this partial tree does not hold the release's whole vllm package"
NOT_CHECKED = f"runtime names not checked: {UNCHECKED_WHY}"

#: The files the checks read: the release's whole ``vllm`` package (what a
#: partial extraction holds for a derived patch, ``also_reads``).
PACKAGE_FILES = ("vllm/**/*.py", "vllm/**/*.pyi")


def settle_runtime(
    patch: DerivedPatch,
    units: Sequence[Unit],
    states: dict[str, Any],
    path: str,
) -> dict[str, Any]:
    """``states`` with every needed part drifted where the fix's code reads
    what the target lacks at run time (see the module's docstring)."""
    context = tree_context()
    needed = [
        unit
        for unit in units
        if unit.kind != "import"
        and (state := states.get(unit.part)) is not None
        and state.state is PatchState.NEEDED
    ]
    if context is None or not needed:
        return states
    if not package_is_whole(context):
        return _unchecked(states)
    package = _package(context)
    modules = _module_names(context, path) | _imported_names(added_imports(patch, path))
    # ty's words first: they name the type (``ModelConfig.is_diffusion``).
    # What ty found on an open interface is there at run time (``excused``).
    excused: set[str] = set()
    why = typed_problem(patch, units, states, path, context, package, excused)
    if why:  # cached without the series' words: they depend on the series
        named = _NAMED.search(why)
        why += _defined_elsewhere(context, patch, named[1]) if named else ""
    else:
        why = undefined_attribute(
            patch,
            needed,
            modules,
            package,
            context,
            _sources(context, package),
            excused,
        )
    if not why:
        return states
    return {  # the detail tells verify's runtime stage (proof/runtime_stage.py)
        part: dataclasses.replace(
            state, state=PatchState.DRIFTED, reason=why, details={RUNTIME: why}
        )
        if state is not None and state.state is PatchState.NEEDED
        else state
        for part, state in states.items()
    }


#: The name a "cannot run" diagnostic of ty is about: a missing attribute or
#: member, an argument the callee does not take, a name not defined.
_NAMED = re.compile(r"(?:has no (?:attribute|member)|Argument|Name) `(\w+)`")


def _unchecked(states: dict[str, Any]) -> dict[str, Any]:
    """``states`` with each needed part saying that what its code reads at
    run time was not checked (``apply`` writes it only when told to:
    ``UNCHECKED``), never silently needed."""
    return {
        part: dataclasses.replace(
            state,
            reason=NOT_CHECKED,
            details={**state.details, UNCHECKED: UNCHECKED_WHY},
        )
        if state is not None and state.state is PatchState.NEEDED
        else state
        for part, state in states.items()
    }


def package_is_whole(context: TreeContext) -> bool:
    """Whether the tree holds every file of its ``vllm`` package: a whole
    tree, or a partial extraction asked for all of it."""
    return context.lacks("vllm/deepstack-patch-probe/absent.py")


# -- the release's vllm package ---------------------------------------------------


@dataclass(frozen=True)
class Package:
    """The bytes of every Python file of the tree's ``vllm`` package, as the
    earlier patches of the series leave them (engine/context.py)."""

    files: tuple[tuple[str, bytes], ...]

    @functools.cached_property
    def by_path(self) -> dict[str, bytes]:
        """``files`` by relative path (read it, never change it)."""
        return dict(self.files)

    @functools.cached_property
    def in_order(self) -> tuple[tuple[str, bytes], ...]:
        """``files`` in the order of their paths (a state's package is: one
        sorting for every state of a plan)."""
        return tuple(sorted(self.files))


def package_of(context: TreeContext) -> Package:
    """The tree's ``vllm`` package, read once per plan (:mod:`.files` looks
    there for what imports a module a fix deletes)."""
    return _package(context)


def _package(context: TreeContext) -> Package:
    key = ("runtime package", context.root)
    if key not in context.memo:
        on_disk = _package_on_disk(context)
        # What earlier patches of the series wrote, in place of the disk's.
        laid = {
            relpath: raw
            for relpath, raw in sorted(context.overlay.items())
            if relpath.startswith("vllm/")
            and relpath.endswith(outside.SEARCHED_SUFFIXES)
        }
        if not laid:
            context.memo[key] = on_disk
            return on_disk
        if laid.keys() <= on_disk.by_path.keys():  # rewritten, none added
            files = tuple((p, laid.get(p, raw)) for p, raw in on_disk.in_order)
        else:
            files = tuple(sorted({**on_disk.by_path, **laid}.items()))
        context.memo[key] = Package(files)
    return context.memo[key]  # type: ignore[return-value]


def _package_on_disk(context: TreeContext) -> Package:
    key = ("runtime package", context.root)
    if key not in context.on_disk:
        files = []
        base = context.root / "vllm"
        for folder, dirs, names in os.walk(base):
            dirs.sort()
            for name in sorted(names):
                if name.endswith(outside.SEARCHED_SUFFIXES):
                    full = os.path.join(folder, name)
                    relpath = os.path.relpath(full, context.root)
                    raw = context.hashed.get(relpath.replace(os.sep, "/"))
                    if raw is None:
                        with open(full, "rb") as handle:
                            raw = handle.read()
                    files.append((relpath, raw))
        context.on_disk[key] = Package(tuple(files))
    return context.on_disk[key]  # type: ignore[return-value]


# -- attributes the release defines nowhere ----------------------------------------


def undefined_attribute(
    patch: DerivedPatch,
    needed: Sequence[Unit],
    file_modules: set[str],
    package: Package,
    context: TreeContext | None = None,
    sources: outside.Sources | None = None,
    excused: Iterable[str] = (),
) -> str:
    """The first attribute the needed units' fix newly reads that the
    release neither defines nor reads anywhere, nor inherits from a class
    outside vLLM (:func:`.outside.inherited`, read in ``sources``); empty
    where there is none. ``file_modules``: what the file's imports bind
    (:func:`_module_names`); ``context``, where given, names another patch
    of the series that defines it; ``excused``: attribute names ty read off
    an open interface (:func:`typed_problem`)."""
    own = _defined_by_patch(patch) | set(excused)
    for unit in needed:
        new = [n for e in unit.edits for n in code_nodes(e.inserted, e.header_after)]
        old = [n for e in unit.edits for n in code_nodes(e.removed, e.header_before)]
        modules = file_modules | _imported_names(new)
        read_before = {node.attr for node in _attributes(old)}
        # A name the fix spells as a string, ``hasattr(layer, "name")`` above
        # ``layer.name``, is one it tests for before it reads it.
        tested = {
            node.value
            for root in new
            for node in ast.walk(root)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        for node in _attributes(new):
            name = node.attr
            if (
                name in read_before
                or name in own
                or name in tested
                or _root(node) in modules
            ):
                continue
            if not _known(name, package) and not (
                sources is not None
                and (
                    (
                        unit.kind == "method"
                        and outside.inherited(
                            node, unit.name.rpartition(".")[0], unit.path, sources
                        )
                    )
                    or outside.annotated(
                        node, new, unit.path, sources, _module_level(patch, unit.path)
                    )
                )
            ):
                shown = ast.unparse(node)
                shown = shown if len(shown) <= 60 else "…" + shown[-59:]
                return (
                    f"the fix reads `{shown}`, which nothing in this release "
                    f"defines or reads (no `{name}` in its vllm package)"
                ) + _defined_elsewhere(context, patch, name)
    return ""


def _module_level(patch: DerivedPatch, path: str) -> list[ast.stmt]:
    """The statements the fix writes at module level in ``path`` (``if
    TYPE_CHECKING:`` included): a local it annotates may name a class they
    import. Parsed only where an annotated local is asked about."""
    return [
        node
        for unit in patch.units
        if unit.path == path and unit.kind in ("import", "module-statement")
        for edit in unit.edits
        for node in code_nodes(edit.inserted, edit.header_after)
    ]


def _defined_elsewhere(
    context: TreeContext | None, patch: DerivedPatch, name: str
) -> str:
    """Which other patch of the series defines ``name``, and in what order
    they apply (:meth:`TreeContext.added_by`); empty where none does."""
    if context is None:
        return ""
    return context.added_by(
        patch.id,
        name,
        lambda other: hasattr(other, "units") and name in _defined_by_patch(other),
    )


def _attributes(nodes: Iterable[ast.AST]) -> list[ast.Attribute]:
    """The attributes ``nodes`` read, in order."""
    found = [
        node
        for root in nodes
        for node in ast.walk(root)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
    ]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _root(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _module_names(context: TreeContext, path: str) -> set[str]:
    """The names the file's imports bind: an attribute of one may be a
    module member (:mod:`.names` checks those of ``vllm``; those of other
    packages are not checked), or a class's, which the typed check sees."""
    raw = context.sources.get(path)
    try:
        body = parsed(raw if raw is not None else context.read(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    return _imported_names(body.body)


def _imported_names(nodes: Iterable[ast.AST]) -> set[str]:
    return {
        (asname or name).split(".")[0] if kind == "import" else (asname or name)
        for kind, _module, _level, name, asname in import_aliases(imports_in(nodes))
    }


def _defined_by_patch(patch: DerivedPatch, outside: str = "") -> set[str]:
    """What the patch's own code defines (not what it imports): attributes
    it assigns, definitions, names and parameters it binds (a new method, a
    field, a parameter its callers in another file pass); with ``outside``,
    in its files other than that one."""
    found: set[str] = set()
    for unit in patch.units:
        if unit.path == outside:
            continue
        for edit in unit.edits:
            for root in code_nodes(edit.inserted, edit.header_after):
                for node in ast.walk(root):
                    match node:
                        case (
                            ast.FunctionDef(name=name)
                            | ast.AsyncFunctionDef(name=name)
                            | ast.ClassDef(name=name)
                            | ast.Name(id=name, ctx=ast.Store())
                            | ast.Attribute(attr=name, ctx=ast.Store())
                            | ast.arg(arg=name)  # a parameter it gives a callee
                        ):
                            found.add(name)
    return found


def _known(name: str, package: Package) -> bool:
    """Whether the package defines ``name`` or reads it as an attribute."""
    return outside.first_mention(name, package.files, package.by_path) is not None


def _sources(context: TreeContext, package: Package) -> outside.Sources:
    """The package's files, those being recognised as the plan hands them
    (a live view: the plan notes each file as it reaches it)."""
    key = ("runtime sources", context.root)
    if key not in context.memo:
        files = ChainMap(context.sources, package.by_path)
        context.memo[key] = outside.Sources(files, probed=context.probed)  # type: ignore[arg-type]
    return context.memo[key]  # type: ignore[return-value]


def _sources_now(context: TreeContext, package: Package) -> outside.Sources:
    """The package's files as :func:`_sources` sees them now, kept as they
    are: a check put off to the pass's end reads them as it would have at
    once."""
    return outside.Sources(
        ChainMap(dict(context.sources), package.by_path),  # type: ignore[arg-type]
        probed=context.probed,
    )


# -- the type checker ----------------------------------------------------------------


def typed_problem(
    patch: DerivedPatch,
    units: Sequence[Unit],
    states: Mapping[str, Any],
    path: str,
    context: TreeContext,
    package: Package,
    excused: set[str] | None = None,
) -> str:
    """ty's first new "cannot run" diagnostic on the fix's lines, worded;
    empty where there is none (cached, see the module's docstring). Into
    ``excused`` go the attribute names ty says a type lacks where that type
    is an open interface (:func:`_of_open_interface`): there at run time.

    Where the plan lets checks wait (``context.defer_checks``), a verdict
    neither cached nor found earlier in the plan is put off to the pass's
    end (:class:`_TypedChecks`: one batch of ty runs for every patch) and
    the answer meanwhile is "nothing found"; the plan is made again where
    the verdict says otherwise."""
    excused = set() if excused is None else excused
    # The files the patch adds are there once it is applied: the fixed file
    # may import them, and a new module is checked as the fix leaves it.
    added = {
        unit.path: unit.after.encode("utf-8")
        for unit in patch.units
        if unit.kind == "new-file"
    }
    raw = b"" if path in added else context.sources.get(path)
    if raw is None:
        try:
            raw = context.read(path)
        except OSError:
            return ""
    reads = _reads(context, package, patch, path, raw)
    key = verdicts.cache_key(
        getattr(patch, "data_fingerprint", b""),
        path,
        raw,
        closure.digest_of(reads),
    )
    checks = _typed_checks(context)
    known = checks.verdicts.get(key)
    if known is None and (cached := verdicts.cached(key)) is not None:
        known = cached, verdicts.cached_excused(key)
    if known is not None:
        excused |= set(known[1])
        return known[0]
    fixed = added.get(path) or _fixed_bytes(context, patch, units, states, path, raw)
    if fixed is None:  # the rewrite refused: apply says so, with its reason
        return ""
    # The other files as the earlier patches of the series leave them,
    # and the files this patch adds.
    others = {r: b for r, b in context.overlay.items() if r != path}
    lines = _written_lines(raw, fixed)
    check = typecheck.Check(
        path,
        {**others, path: raw},
        {**others, **{p: t for p, t in added.items() if p != path}, path: fixed},
        functools.partial(closure.reads_file, reads),
        needs_before=functools.partial(_any_new_on, lines),
        written=frozenset(lines),
    )
    if context.defer_checks:
        sources = _sources_now(context, package)
        conclude = functools.partial(_concluded, patch, units, path, lines, fixed)
        checks.defer(key, check, lambda found: conclude(sources, found))
        return ""
    (found,) = typecheck.diagnostics_of(context.root, [check])
    if isinstance(found, typecheck.CheckerFailed):
        context.unsettled = True
        return _could_not_check(path, found)
    problem, names, kept = _concluded(
        patch, units, path, lines, fixed, _sources(context, package), found
    )
    if kept:
        verdicts.store(key, problem, names)
    excused |= set(names)
    return problem


def _could_not_check(path: str, failed: typecheck.CheckerFailed) -> str:
    return f"the type checker could not check the fixed {path}: {failed}"


def _any_new_on(lines: set[int], after: list[typecheck.Diagnostic]) -> bool:
    """Whether ty's diagnostics on the fixed file hold a "cannot run" one on
    the fix's ``lines``: only such a one needs the file's diagnostics as it
    is (:func:`_concluded` reads them to excuse it), so only then is the
    file checked as it is (``typecheck.Check.needs_before``)."""
    return any(_cannot_run_on(d, lines) for d in after)


def _cannot_run_on(diagnostic: typecheck.Diagnostic, lines: set[int]) -> bool:
    """A "cannot run" diagnostic on one of the fix's ``lines``: the only kind
    a verdict weighs (:func:`_concluded`), and so the only kind that asks
    for the file as it is (:func:`_any_new_on`)."""
    return diagnostic.line in lines and _cannot_run(diagnostic)


def _concluded(
    patch: DerivedPatch,
    units: Sequence[Unit],
    path: str,
    lines: set[int],
    fixed: bytes,
    sources: outside.Sources,
    found: tuple[list[typecheck.Diagnostic], list[typecheck.Diagnostic]],
) -> tuple[str, list[str], bool]:
    """What ty's diagnostics on ``path`` as it is and as fixed (``found``;
    as it is ``[]``, not checked, where :func:`_any_new_on` found nothing
    on ``lines``, the fixed file's lines the fix wrote) mean: the first new
    "cannot run" one on the fix's lines, worded (empty where none), the
    attribute names ty said a type lacks where that type is an open
    interface or a mixin's (there at run time), sorted, and
    whether the verdict may be kept across runs. It may not where an
    attribute ty says is missing was excused, or looked for in the classes
    that mix ``self``'s class in: the cache key is the checked file's
    closure, and the classes that decide it (an interface's
    implementations, a mixin's users) may lie outside it. A missing
    attribute of a concrete class (``ToyConfig.strict``) is the closure's
    alone, and kept."""
    before, after = found
    # ty sees this file as fixed, so what the patch defines here is there
    # already; only its other files are seen as the tree has them.
    own = _defined_by_patch(patch, outside=path)
    old = Counter(_identity(d) for d in before)
    excused: set[str] = set()
    looked_across = False
    for diagnostic in after:
        identity = _identity(diagnostic)
        if old[identity] > 0:
            old[identity] -= 1
            continue
        if not _cannot_run_on(diagnostic, lines):
            continue
        missing = _MISSING.search(diagnostic.message)
        if _of_open_interface(diagnostic, sources) or _of_mixin(
            diagnostic, sources, fixed, path
        ):
            excused.add(missing["name"])  # type: ignore[index]
            looked_across = True
            continue
        # ``self`` lacks it: the classes that mix its class in were looked
        # for across the package, and refused.
        looked_across = looked_across or (
            missing is not None and missing["owner"].startswith("Self@")
        )
        if not _about_its_own(diagnostic, own):
            return worded(diagnostic, path, units), sorted(excused), not looked_across
    return "", sorted(excused), not looked_across


@dataclass
class _TypedChecks:
    """The typed checks of one plan that were neither cached nor known,
    put off to the end of a pass of the plan (``pending``: the cache key,
    the check, and what makes a verdict of its diagnostics) and run then as
    one batch (:func:`.typecheck.diagnostics_of`); the verdicts they gave
    (problem, excused names), for the passes after."""

    root: Path
    #: Told where ty could not run (``unsettled``: the plan is not kept).
    context: TreeContext = field(repr=False, compare=False)
    pending: dict[
        str,
        tuple[
            typecheck.Check,
            Callable[
                [tuple[list[typecheck.Diagnostic], list[typecheck.Diagnostic]]],
                tuple[str, list[str]],
            ],
        ],
    ] = field(default_factory=dict)
    verdicts: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    #: The servers the checks put off are told to at once, and checked by
    #: while the plan goes on (started at the first; the plan's end stops
    #: them), and the number each check was asked as.
    ahead: typecheck.ChecksAhead | None = field(default=None, repr=False)
    asked: dict[str, int] = field(default_factory=dict, repr=False)
    started: bool = False

    def defer(
        self,
        key: str,
        check: typecheck.Check,
        conclude: Callable[
            [tuple[list[typecheck.Diagnostic], list[typecheck.Diagnostic]]],
            tuple[str, list[str]],
        ],
    ) -> None:
        """Put ``check`` off to the pass's end (``conclude`` makes its verdict
        of what ty finds), and have it checked meanwhile where a server can."""
        self.pending[key] = check, conclude
        if typecheck.SERVED and not self.started:
            self.started = True
            self.ahead = typecheck.ChecksAhead.start(self.root)
            if self.ahead is not None:
                self.context.closing.push(self.ahead)  # its __exit__
        if self.ahead is not None and (number := self.ahead.ask(check)) is not None:
            self.asked[key] = number

    def run(self) -> bool:
        """Run what waits; True where a verdict is not the "nothing found"
        the pass was answered meanwhile."""
        import_lists.save()  # the import lists this pass scanned, once
        answered = self.ahead.answers(list(self.asked.values())) if self.ahead else {}
        keys = list(self.pending)
        left = [key for key in keys if self.asked.get(key) not in answered]
        checked: dict[str, typecheck.Checked] = {
            key: answered[number]
            for key, number in self.asked.items()
            if number in answered
        }
        checked.update(
            zip(
                left,
                typecheck.diagnostics_of(
                    self.root, [self.pending[key][0] for key in left]
                ),
                strict=True,
            )
        )
        answered_wrongly = False
        for key in keys:
            found = checked[key]
            check, conclude = self.pending[key]
            if isinstance(found, typecheck.CheckerFailed):
                self.context.unsettled = True
                verdict = _could_not_check(check.path, found), []
            else:  # as a check run at once would, kept in the cache
                problem, names, kept = conclude(found)
                verdict = problem, names
                if kept:
                    verdicts.store(key, problem, names)
            self.verdicts[key] = verdict
            answered_wrongly = answered_wrongly or verdict != ("", [])
        self.pending.clear()
        self.asked.clear()
        return answered_wrongly


def _typed_checks(context: TreeContext) -> _TypedChecks:
    """The plan's typed checks (kept across its passes)."""
    found = context.deferred.get("typed checks")
    if not isinstance(found, _TypedChecks):
        found = context.deferred["typed checks"] = _TypedChecks(context.root, context)
    return found


def _reads(
    context: TreeContext, package: Package, patch: DerivedPatch, path: str, raw: bytes
) -> dict[str, str]:
    """What ty can read when it checks ``path`` as it is and as fixed: the
    modules its imports reach, and those the fix's code imports (its units'
    code in this file: the fixed file imports no more), as the earlier
    patches of the series leave them (:meth:`.closure.ModuleIndex.closure`)."""
    memo = ("closure index", context.root)
    if memo not in context.memo:  # one per state of the overlay
        context.memo[memo] = closure.ModuleIndex(package.by_path)
    index: closure.ModuleIndex = context.memo[memo]  # type: ignore[assignment]
    fix = [
        code
        for unit in patch.units
        if unit.path == path
        for code in (unit.after, *(edit.inserted for edit in unit.edits))
    ]
    found = index.closure(path, [raw, *fix])
    context.closures.setdefault(id(found), found)  # what ty reads
    return found


#: ``| None`` in a type ty names: a fix that tests ``x is not None`` before
#: it reads ``x.a`` turns ``X | None`` into ``X`` in the message.
_OR_NONE = re.compile(r" \| None\b|\bNone \| ")


def _identity(diagnostic: typecheck.Diagnostic) -> tuple[str, str]:
    """What makes a diagnostic the same before and after the fix: its rule
    and its words, not its line, and a type the fix only narrowed from
    ``X | None`` to ``X`` the same type (vllm#47606 moves a read of
    ``reasoning_parser.finish_streaming()`` under ``is not None``, which
    0.25.0's own file already makes)."""
    return diagnostic.rule, _OR_NONE.sub("", diagnostic.message)


def _cannot_run(diagnostic: typecheck.Diagnostic) -> bool:
    if diagnostic.rule not in CANNOT_RUN:
        return False
    if diagnostic.rule == "import-not-found":  # third-party packages are absent
        return re.search(r"`vllm[.`]", diagnostic.message) is not None
    return True


def _about_its_own(diagnostic: typecheck.Diagnostic, own: set[str]) -> bool:
    """Whether the diagnostic names what the patch defines itself in one of
    its other files (the type checker sees them as the tree has them). Never
    a name it defines in the file checked: ``self.only = config.only`` in
    one ``__init__`` (vllm#50275) still reads ``config.only``."""
    return any(word in own for word in re.findall(r"`(\w+)`", diagnostic.message))


def _of_open_interface(
    diagnostic: typecheck.Diagnostic, sources: outside.Sources
) -> bool:
    """Whether ty says an attribute is missing on a type whose objects at
    run time may come from outside vLLM (:func:`.outside.open_interface`:
    a ``Protocol``, an abstract class vLLM does not implement)."""
    missing = _MISSING.search(diagnostic.message)
    return (
        diagnostic.rule == "missing-attribute"
        and missing is not None
        and diagnostic.message.startswith("Object of type")
        and outside.open_interface(missing["owner"], sources)
    )


def _of_mixin(
    diagnostic: typecheck.Diagnostic, sources: outside.Sources, fixed: bytes, path: str
) -> bool:
    """Whether ty says ``self`` lacks an attribute (``Self@method``) in a
    method of a mixin that every vLLM class mixing it in has
    (:func:`.outside.mixed_in`); the class is the one whose ``method``
    holds the diagnostic's line in the fixed file."""
    missing = _MISSING.search(diagnostic.message)
    if diagnostic.rule != "missing-attribute" or missing is None:
        return False
    match missing["owner"].partition("@"):
        case ("Self", "@", method):
            owner = _class_holding(fixed, method, diagnostic.line)
        case _:
            return False
    return bool(owner) and bool(outside.mixed_in(owner, path, missing["name"], sources))


def _class_holding(code: bytes, method: str, line: int) -> str:
    """The qualified name of the class whose method ``method`` holds
    ``line`` of ``code``; empty where none does."""
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError):
        return ""

    def search(body: list[ast.stmt], outer: str) -> str:
        for node in body:
            if not isinstance(node, ast.ClassDef):
                continue
            qualname = f"{outer}{node.name}"
            for inner in node.body:
                match inner:
                    case (
                        ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name)
                    ) if name == method and (
                        inner.lineno <= line <= (inner.end_lineno or 0)
                    ):
                        return qualname
            if found := search(node.body, f"{qualname}."):
                return found
        return ""

    return search(module.body, "")


_MISSING = re.compile(
    r"(?:Object of type|Class|Module) `(?P<owner>[^`]+)` has no "
    r"(?:attribute|member) `(?P<name>[^`]+)`"
)


def worded(
    diagnostic: typecheck.Diagnostic, path: str, units: Sequence[Unit] = ()
) -> str:
    """A drift reason in ty's words (``the fix reads `A.b`, which this
    release lacks``, where the diagnostic names an attribute). ty calls the
    type of ``self`` in a method ``Self@method``: the reason names the
    method's class, as the unit does (``Head.combine``)."""
    said = f"ty: {diagnostic.message} [{diagnostic.rule}]"
    missing = _MISSING.search(diagnostic.message)
    if missing and diagnostic.message.startswith("Module"):
        return (
            f"the fix needs `{missing['name']}` from `{missing['owner']}`, which "
            f"this release lacks ({said})"
        )
    if missing:
        owner = _class_of_self(missing["owner"], units)
        return (
            f"the fix reads `{owner}.{missing['name']}`, which this "
            f"release lacks ({said})"
        )
    return (
        f"the fix's code cannot run in this release ({said}, at line "
        f"{diagnostic.line} of the fixed {path})"
    )


def _class_of_self(owner: str, units: Sequence[Unit]) -> str:
    """``Self@combine`` as the class whose method ``combine`` a unit is
    (``Head``), where exactly one is; else ``owner`` as ty wrote it."""
    match owner.partition("@"):
        case ("Self", "@", method):
            classes = {
                unit.name.rpartition(".")[0]
                for unit in units
                if unit.name.rpartition(".")[2] == method and "." in unit.name
            }
            if len(classes) == 1:
                return classes.pop()
    return owner


def _fixed_bytes(
    context: TreeContext,
    patch: DerivedPatch,
    units: Sequence[Unit],
    states: Mapping[str, Any],
    path: str,
    raw: bytes,
) -> bytes | None:
    """The file as the patch's rewrite leaves it (as the plan rewrites:
    ``context.rewrite``), or None where it refuses or there is no plan."""
    from deepstack_patch.engine.errors import DeepstackError, RewriteRefused

    if context.rewrite is None:
        return None
    needed = [
        Finding(
            state=state.state,
            symbol=unit.name,
            line=state.span[0],
            span=state.span,
            part=unit.part,
            details=state.details,
        )
        for unit in units
        if (state := states.get(unit.part)) is not None
        and state.state is PatchState.NEEDED
    ]
    try:
        return context.rewrite(patch, path, raw, needed)  # type: ignore[arg-type]
    except (RewriteRefused, DeepstackError):
        return None


def _written_lines(before: bytes, after: bytes) -> set[int]:
    """The 1-based lines of ``after`` that a line diff from ``before`` wrote
    (the lines both start and end with are never written: a fix changes a
    few places of a file of thousands of lines, and the diff's cost grows
    with the square of the lines it compares)."""
    old, new = before.splitlines(), after.splitlines()
    same_start = 0
    while same_start < min(len(old), len(new)) and old[same_start] == new[same_start]:
        same_start += 1
    same_end = 0
    while (
        same_end < min(len(old), len(new)) - same_start
        and old[-1 - same_end] == new[-1 - same_end]
    ):
        same_end += 1
    matcher = difflib.SequenceMatcher(
        None,
        old[same_start : len(old) - same_end],
        new[same_start : len(new) - same_end],
        autojunk=False,
    )
    return {
        same_start + line + 1
        for tag, _i1, _i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
        for line in range(j1, j2)
    }

"""Which of the release's own tests exercise what a patch changes (static).

Test-impact tools answer "which tests can a change affect?" three ways:
pytest-testmon records, per test, the code coverage reached (exact, but it
needs a recorded run of the whole suite first); pytest-picked runs the test
files git says changed (nothing for a fix that changes no test); Bazel's
affected targets walk the reverse-dependency graph of the changed files'
targets. A release's ``tests/`` has no recorded run and the fix changes no
test, so this module walks the reverse dependencies as Bazel does, at the
grain of Python imports, then narrows by name, which a graph of files
cannot:

1. **by import**: the test modules of ``tests/`` that import a module the
   patch changes (``import vllm.a.b``, ``from vllm.a.b import X``,
   ``from vllm.a import b``, at module level or inside a function);
2. **by name**: in such a module, the tests whose code, with the module's
   own helpers, fixtures and constants it uses, refers to a changed unit:
   the changed function or class itself, or a top-level name of the changed
   module whose code refers to one (a function that calls the changed
   helper, a class whose method calls it).

3. **one import further**, where the first two select nothing: a module of
   the package that imports a changed module (``eagle.py``'s
   ``EagleProposer`` subclasses the changed
   ``SpecDecodeBaseProposer``) counts as changed too, by its names whose
   code refers to a changed unit: a test that names ``EagleProposer``
   reaches ``SpecDecodeBaseProposer.__init__``. One import only, as Bazel's
   direct reverse dependencies: two would take most of vLLM (one cycle of
   imports holds ``vllm.config``), and every test with it.

A test reaches a unit where it names it; where that cannot be told (the
module's names come with ``import *``, or the module object itself is
passed around) every test of the file that refers to the module counts,
and the selection says so. Only ``ast``: nothing is imported, nothing runs.
Nothing here names a fix.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deepstack_patch.proof.imports import module_name
from deepstack_patch.proof.reaching import (
    ChangedUnit,
    definitions,
    dotted_name,
    dotted_refs,
    reaching_names,
    read_text,
    spread,
)

#: pytest's default collection rules (vLLM's configuration keeps them).
TEST_FILE_PREFIX = "test_"
TEST_FUNCTION_PREFIX = "test"
TEST_CLASS_PREFIX = "Test"


@dataclass
class Selection:
    """The tests chosen for one patch, and why."""

    #: node id -> the changed units (their ``part``) it reaches.
    tests: dict[str, list[str]] = field(default_factory=dict)
    #: The test files that import a changed module.
    importers: list[str] = field(default_factory=list)
    #: Test files where names could not be told apart: every test that
    #: refers to the module was taken (file: why).
    coarse: dict[str, str] = field(default_factory=dict)
    #: The modules of the package, one import from a changed one, through
    #: which a test was selected (module -> the changed modules it imports).
    through: dict[str, list[str]] = field(default_factory=dict)
    #: The modules whose names reached a changed unit in a selected test.
    named: set[str] = field(default_factory=set, repr=False)
    #: The changed units no selected test reaches.
    unreached: list[str] = field(default_factory=list)
    #: Why nothing could be selected at all ("" when something could).
    reason: str = ""


def units_of(
    patch: object,
    changed_files: Sequence[str],
    symbols: Sequence[tuple[str, str]] = (),
) -> list[ChangedUnit]:
    """A derived patch's units; a hand-written one's are the functions and
    methods it was found at (``symbols``: file, ``C.m``), and a changed file
    where it was found at none of those changes as a whole (one
    module-statement unit)."""
    units = getattr(patch, "units", None)
    if units:
        return [ChangedUnit(u.path, u.kind, u.name) for u in units]
    found = [
        ChangedUnit(path, "method" if "." in name else "function", name)
        for path, name in symbols
        if path in changed_files
        and all(part.isidentifier() for part in name.split("."))
    ]
    named = {unit.path for unit in found}
    return found + [
        ChangedUnit(path, "module-statement", "")
        for path in changed_files
        if path not in named
    ]


def select(tree: Path, units: Sequence[ChangedUnit]) -> Selection:
    """The tests of ``tree``'s ``tests/`` that reach ``units`` (see above)."""
    tests_dir = tree / "tests"
    if not tests_dir.is_dir():
        return Selection(reason=f"{tree} has no tests/ folder")
    by_module: dict[str, list[ChangedUnit]] = {}
    for unit in units:
        module = module_name(unit.path)
        if module is not None:
            by_module.setdefault(module, []).append(unit)
    if not by_module:
        return Selection(reason="the patch changes no module of the vllm package")
    reaching: dict[str, dict[str, set[str]]] = {}
    narrowing: dict[str, frozenset[str]] = {}
    for module, changed in by_module.items():
        reaching[module], narrowed = reaching_names(tree / changed[0].path, changed)
        narrowing.update(narrowed)
    selection, reached = _select(tree, tests_dir, reaching, narrowing)
    if not selection.tests:
        # None of the changed modules' own tests reaches a unit: one import
        # further (a module's own tests, where it has them, are the cheaper
        # and the closer evidence; the hop took verify's tests of 0.20.2
        # from minutes to ten where they had them).
        importing = _importing_modules(tree, reaching)
        if importing:
            wider = {m: names for m, (names, _) in importing.items()}
            selection, reached = _select(
                tree, tests_dir, {**reaching, **wider}, narrowing
            )
            selection.through = {
                module: imported
                for module, (_, imported) in importing.items()
                if module in selection.named
            }
    selection.unreached = [u.part for u in units if u.part not in reached]
    if not selection.importers:
        selection.reason = (
            "no test module of tests/ imports a module the patch changes, "
            "nor a module that imports one"
        )
    elif not selection.tests:
        selection.reason = (
            "the test modules that import the changed modules have no test "
            "that refers to a changed unit"
        )
    return selection


def _select(
    tree: Path,
    tests_dir: Path,
    reaching: dict[str, dict[str, set[str]]],
    narrowing: dict[str, frozenset[str]],
) -> tuple[Selection, set[str]]:
    """The tests that reach a unit through ``reaching``'s modules, and the
    units they reach."""
    selection = Selection()
    reached: set[str] = set()
    for path in _test_files(tests_dir):
        relative = path.relative_to(tree).as_posix()
        module = _parsed(path, tuple(reaching))
        if module is None:
            continue
        found = _select_in_file(
            relative, module, reaching, (reaching, narrowing), selection
        )
        for nodeid, parts in found.items():
            selection.tests[nodeid] = parts
            reached.update(parts)
    return selection, reached


def _test_files(tests_dir: Path) -> Iterator[Path]:
    for path in sorted(tests_dir.rglob("*.py")):
        name = path.name
        if name.startswith(TEST_FILE_PREFIX) or name.endswith("_test.py"):
            yield path


def _parsed(path: Path, modules: tuple[str, ...]) -> ast.Module | None:
    """The file's syntax tree, where its text can import one of ``modules``
    (``vllm.a.b`` or ``from vllm.a import b``, :func:`_importing`); None
    where it cannot, or does not parse. Parsed once per run of verify."""
    source = read_text(path)
    if source is None or not any(  # cheap first: most files name none
        m in source
        or (m.rpartition(".")[0] in source and m.rpartition(".")[2] in source)
        for m in modules
    ):
        return None
    if not _importing(modules).search(source):
        return None
    stat = path.stat()
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _importing(modules: tuple[str, ...]) -> re.Pattern[str]:
    """What a file that imports one of ``modules`` holds: the module's
    dotted name after ``import`` or ``from``, or ``from`` its package
    ``import`` its name (in a parenthesised list too). It may find more (in
    a string): the syntax tree decides."""
    forms = []
    for module in modules:
        package, _, last = module.rpartition(".")
        forms.append(rf"(?:import|from)\s+{re.escape(module)}\b")
        if package:
            forms.append(
                rf"from\s+{re.escape(package)}\s+import\s+(?:\([^)]*|[^\n]*)"
                rf"\b{re.escape(last)}\b"
            )
    return re.compile("|".join(forms))


@functools.lru_cache(maxsize=4096)
def _parse(path: Path, mtime_ns: int, size: int) -> ast.Module | None:
    """One file's syntax tree; the key holds its time and size, so that a
    file changed since is parsed again."""
    source = read_text(path)
    try:
        return ast.parse(source, str(path)) if source is not None else None
    except SyntaxError:
        return None


# -- one import further: the package's modules that import a changed one -------


def _importing_modules(
    tree: Path, reaching: dict[str, dict[str, set[str]]]
) -> dict[str, tuple[dict[str, set[str]], list[str]]]:
    """Each module of the tree's ``vllm`` package that imports a changed
    module (``reaching``'s keys), with its top-level names whose code
    reaches a changed unit (as :func:`reaching_names` finds them in the
    changed module: to a fixed point) and the changed modules it imports.
    A module with no such name is left out. Only ``ast``, as the rest."""
    found: dict[str, tuple[dict[str, set[str]], list[str]]] = {}
    package = tree / "vllm"
    if not package.is_dir():
        return found
    changed = tuple(reaching)
    for path in sorted(package.rglob("*.py")):
        name = module_name(path.relative_to(tree).as_posix())
        if name is None or name in reaching:
            continue
        module = _parsed(path, changed)
        if module is None:
            continue
        bindings, starred = _bindings(module, reaching)
        if not bindings and not starred:
            continue
        scratch = Selection()
        names: dict[str, set[str]] = {}
        defined = definitions(module.body)
        for top, nodes in defined.items():
            refs = {r for node in nodes for r in dotted_refs(node)}
            parts = _reached(refs, bindings, reaching, starred, "", scratch)
            if parts:
                names[top] = parts
        # What it imports at module level is a name of its own too (a
        # package's __init__ passes the changed class on).
        top_level = [s for s in module.body if isinstance(s, _MODULE_LEVEL_IMPORTS)]
        exported, _ = _bindings(ast.Module(body=top_level, type_ignores=[]), reaching)
        for local, dotted in exported.items():
            if parts := _units_named(dotted, reaching, "", scratch):
                names.setdefault(local, set()).update(parts)
        if not names:
            continue
        spread(names, defined)
        imported = sorted(
            m for m in changed if any(b == m or b.startswith(m + ".") for b in
                                      bindings.values()) or m in starred
        )  # fmt: skip
        found[name] = (names, imported)
    return found


#: The statements of a module whose imports bind its own names.
_MODULE_LEVEL_IMPORTS = (ast.Import, ast.ImportFrom, ast.If, ast.Try)


# -- a test file ----------------------------------------------------------------


def _select_in_file(
    relative: str,
    module: ast.Module,
    by_module: dict[str, list[ChangedUnit]],
    changed: tuple[dict[str, dict[str, set[str]]], dict[str, frozenset[str]]],
    selection: Selection,
) -> dict[str, list[str]]:
    """The tests of one file that reach a changed unit, by node id."""
    reaching, narrowing = changed
    bindings, starred = _bindings(module, by_module)
    if not bindings and not starred:
        return {}
    selection.importers.append(relative)
    if starred:
        selection.coarse[relative] = (
            f"`from {starred[0]} import *`: its names cannot be told apart"
        )
    defined = definitions(module.body)
    found: dict[str, list[str]] = {}
    for nodeid, nodes in _tests(relative, module):
        refs, code = _closure(nodes, defined)
        parts = _reached(refs, bindings, reaching, starred, relative, selection)
        # A changed method reached through its class alone: the test must
        # name it, or a method of the class that calls it.
        named = {
            n.attr for c in code for n in ast.walk(c) if isinstance(n, ast.Attribute)
        }
        parts = {
            part for part in parts if part not in narrowing or narrowing[part] & named
        }
        if parts:
            found[nodeid] = sorted(parts)
    return found


def _bindings(
    module: ast.Module, by_module: dict[str, list[ChangedUnit]]
) -> tuple[dict[str, str], list[str]]:
    """The file's local names for the changed modules and their members
    (``m`` -> ``vllm.a.b``, ``X`` -> ``vllm.a.b.X``, ``vllm`` -> ``vllm``),
    and the changed modules it star-imports."""
    bindings: dict[str, str] = {}
    starred: list[str] = []

    def within(dotted: str) -> bool:
        """A changed module, or a name inside one."""
        return any(dotted == m or dotted.startswith(m + ".") for m in by_module)

    for node in _import_statements(module.body):
        match node:
            case ast.Import(names=names):
                for alias in names:
                    if not within(alias.name):
                        continue
                    if alias.asname:
                        bindings[alias.asname] = alias.name
                    else:  # `import vllm.a.b` binds `vllm`
                        root = alias.name.split(".")[0]
                        bindings[root] = root
            case ast.ImportFrom(module=str(source), names=names, level=0):
                for alias in names:
                    dotted = f"{source}.{alias.name}"
                    if alias.name == "*":
                        if source in by_module:
                            starred.append(source)
                    elif within(dotted):
                        bindings[alias.asname or alias.name] = dotted
    return bindings, starred


def _import_statements(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of a block and of the blocks inside it (a
    function's, a class's, an ``if``'s): statements only, as an import is
    one; walking every expression as well took seconds on vLLM's models."""
    pending = list(body)
    while pending:
        statement = pending.pop()
        if isinstance(statement, ast.Import | ast.ImportFrom):
            yield statement
            continue
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(statement, name, None)
            if isinstance(inner, list):
                pending.extend(inner)


def _tests(relative: str, module: ast.Module) -> Iterator[tuple[str, list[ast.AST]]]:
    """The file's tests as pytest collects them by default, each with the
    code it runs that the file holds: its function (decorators included:
    ``parametrize`` arguments), and for a method its class's own
    statements, setup methods and the methods it calls on ``self``."""
    for statement in module.body:
        match statement:
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name) if (
                name.startswith(TEST_FUNCTION_PREFIX)
            ):
                yield f"{relative}::{name}", [statement]
            case ast.ClassDef(name=name) if _is_test_class(statement):
                yield from _class_tests(f"{relative}::{name}", statement)


def _is_test_class(node: ast.ClassDef) -> bool:
    bases = {dotted_name(base).rsplit(".", 1)[-1] for base in node.bases}
    return node.name.startswith(TEST_CLASS_PREFIX) or "TestCase" in bases


def _class_tests(
    prefix: str, node: ast.ClassDef
) -> Iterator[tuple[str, list[ast.AST]]]:
    methods = {
        s.name: s
        for s in node.body
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    shared: list[ast.AST] = [*node.decorator_list, *node.bases]
    shared += [s for s in node.body if s.__class__.__name__ not in _FUNCTION_NODES]
    shared += [m for n, m in methods.items() if n.lower().startswith("setup")]
    for name, method in methods.items():
        if not name.startswith(TEST_FUNCTION_PREFIX):
            continue
        nodes: list[ast.AST] = [method, *shared]
        seen = {name}
        pending = [method]
        while pending:  # the methods it calls on self, and theirs
            for ref in dotted_refs(pending.pop()):
                called = ref.split(".")[1] if ref.startswith("self.") else ""
                if called in methods and called not in seen:
                    seen.add(called)
                    nodes.append(methods[called])
                    pending.append(methods[called])
        yield f"{prefix}::{name}", nodes


_FUNCTION_NODES = ("FunctionDef", "AsyncFunctionDef")


def _closure(
    nodes: Sequence[ast.AST], defined: dict[str, list[ast.AST]]
) -> tuple[set[str], list[ast.AST]]:
    """The dotted names ``nodes`` use, with those of the file's own helpers,
    fixtures (a parameter named as a function of the file) and constants
    they use, and theirs; and all that code."""
    refs: set[str] = set()
    seen: set[str] = set()
    code = list(nodes)
    pending = list(nodes)
    while pending:
        node = pending.pop()
        names = set(dotted_refs(node))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names |= {a.arg for a in [*node.args.args, *node.args.kwonlyargs]}
        refs |= names
        for name in names:
            root = name.split(".")[0]
            if root in defined and root not in seen:
                seen.add(root)
                pending.extend(defined[root])
                code.extend(defined[root])
    return refs, code


def _reached(
    refs: set[str],
    bindings: dict[str, str],
    reaching: dict[str, dict[str, set[str]]],
    starred: list[str],
    relative: str,
    selection: Selection,
) -> set[str]:
    """The changed units a test's names reach."""
    parts: set[str] = set()
    for ref in refs:
        root, _, rest = ref.partition(".")
        if root in bindings:
            dotted = bindings[root] + (f".{rest}" if rest else "")
            parts |= _units_named(dotted, reaching, relative, selection)
        for module in starred:  # any name may be the module's
            parts |= reaching[module].get(root, set())
    return parts


def _units_named(
    dotted: str,
    reaching: dict[str, dict[str, set[str]]],
    relative: str,
    selection: Selection,
) -> set[str]:
    """The units ``dotted`` (a name resolved through the file's imports)
    reaches: a changed module's top-level name, or the module itself."""
    parts: set[str] = set()
    for module, names in reaching.items():
        if dotted == module:  # the module object itself: its use is unknown
            selection.coarse.setdefault(
                relative, f"uses the module {module} itself: its names cannot be told"
            )
            parts |= set().union(*names.values()) if names else set()
        elif dotted.startswith(module + "."):
            top = dotted[len(module) + 1 :].split(".")[0]
            gained = names.get(top, set()) | names.get("*", set())
            if gained:
                selection.named.add(module)
            parts |= gained
    return parts

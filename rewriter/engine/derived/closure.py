"""The ``vllm`` modules ty can read when it checks one file: what a typed
verdict (:mod:`.typecheck`) depends on besides the file itself.

ty resolves a module only where a static import names it, so the modules
it can reach from a file are the transitive closure of the static imports
inside the package: absolute and relative ``import`` and ``from … import``,
wherever they stand (under ``if TYPE_CHECKING:``, in a function), a ``*``
import's module, and a name imported from a package that may be one of its
submodules. A module stands in the key by each of its files
that exists (``.pyi`` and ``.py``, module and package) with its content's
hash, or, where none does, by whether it is a folder (a namespace package)
or absent: a module that appears or goes away is a new key too.

A package's ``__init__`` is in the closure where code names the package
(``import vllm.a.b`` binds ``vllm``; ``from vllm import a`` reads it), not
merely because a module lies inside it: ty reads a package's body only for
its names (tried on ty 0.0.108: a ``p/__init__.py`` that rebinds ``q``
and defines ``__getattr__`` leaves what ``from p.q import r`` reads as it
was). ``vllm/__init__.py``
imports most of the package under ``TYPE_CHECKING``, and would put every
module in every closure. Which ``__init__`` files a package on the way has
is in the key all the same: it decides how ty resolves what lies inside.

In vLLM a closure is large: on 0.20.2 the files of ten derived fixes each
reach 803-808 of the package's 1,621 files, one cycle of imports that
``vllm.logger``, ``vllm.envs`` and ``vllm.config`` are in. An edit to one of
those checks every patch again, as it must; the other half of the package
(``vllm/benchmarks``, ``vllm/assets``, most models) is outside them all.

Since most files reach that cycle, what each strongly connected component
of the import graph reaches is worked out once per state of the tree and
shared (:meth:`ModuleIndex._reachable`), and so is each closure and its
digest among the files whose imports join the same components. A later
state (the overlay after a fix) keeps a component's answer where no module
it reaches imports otherwise than before (a fix rewrites code, seldom
imports), and each closure of those, with the changed modules' states.
On the 40-fix batch of 0.20.2 the walks took about 1.8 s of a first
status, 52 of them over about 3,300 modules and packages each.

Each file's import list is kept under its content's hash, and scanned
ahead where none is kept (:mod:`.import_lists`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from deepstack_patch.engine.derived import import_lists
from deepstack_patch.engine.derived.import_lists import Import, Summary
from deepstack_patch.engine.derived.names import absolute_module

#: Bump when what is stored changes meaning.
_SCHEMA = "1"


class ModuleIndex:
    """The tree's ``vllm`` package as one state of the overlay presents it
    (relative path -> bytes), with what was worked out on it."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self.files = files
        last = _LAST[0] if _LAST else None
        # The overlay's next state rewrites files, seldom adds one.
        same_paths = last is not None and files.keys() == last.files.keys()
        self.folders = last.folders if same_paths else _folders(files)  # type: ignore[union-attr]
        self._modules: dict[str, str] = {}
        self._edges: dict[str, list[str]] = {}
        #: What ty may read from each module (see _reachable).
        self._reach: dict[str, frozenset[str]] = {}
        self._init_files: dict[str, str] = {}
        #: Each closure made, by the components it joins (see closure).
        self._closures: dict[frozenset[int], Closure] = {}
        #: Each closure an earlier index made whose components all stand
        #: here, with the modules changed since: made again only where
        #: asked for (most are not, and a copy is 4,500 modules).
        self._earlier: dict[frozenset[int], tuple[Closure, frozenset[str]]] = {}
        #: How many files were scanned (not found in the cache): measured.
        self.scanned = 0
        if last is not None:
            self._inherit(last, same_paths)
        _LAST[:] = [self]

    def _inherit(self, last: ModuleIndex, same_paths: bool) -> None:
        """Take what ``last`` (the index made before this one: the overlay's
        last state, as a rule) worked out on each module whose files are
        the same here, and each module's state where the folders are too
        (``same_paths``: the two hold the same paths). Copied whole, the
        changed modules then left out: a state changes a few of vLLM's
        5,000 modules."""
        get, was = self.files.get, last.files.get
        changed = {
            _module_of(relpath)
            for relpath in self.files.keys() | last.files.keys()
            if (now := get(relpath)) is not (then := was(relpath)) and now != then
        }
        self._edges = _without(last._edges, changed)
        # A fix rewrites code, seldom imports: a changed module whose edges
        # are the same leaves what every module reaches as it was. (A module
        # ``last`` never walked is in nothing ``last`` worked out.)
        rewired = {m for m in changed if m in last._edges and self._rewires(m, last)}
        self._reach = (
            {m: r for m, r in last._reach.items() if r.isdisjoint(rewired)}
            if rewired
            else dict(last._reach)
        )
        if not same_paths and self.folders != last.folders:
            return
        self._modules = _without(last._modules, changed)
        if not same_paths:
            return  # a package on the way may have gained or lost an __init__
        # Each closure whose components all stand, to be made again with
        # the states of the modules changed since it was made (see
        # closure). A component that no longer stands may be gone, and its
        # id another's: its closures are never looked up. Where none was
        # rewired, all stand.
        standing = {id(r) for r in self._reach.values()} if rewired else None
        since_last = frozenset(changed)
        self._earlier = {
            key: (found, since | since_last)
            for key, (found, since) in (
                *((key, (found, frozenset())) for key, found in last._closures.items()),
                *last._earlier.items(),
            )
            if standing is None or key <= standing
        }

    def _rewires(self, module: str, last: ModuleIndex) -> bool:
        """Whether ``module``'s edges here may change what a module reaches
        in ``last``. Not where it only gained edges to modules it reached
        there already (a fix's new import, as a rule, of a module of vLLM's
        one cycle): each stands for a path there was, so every module
        reaches what it did. One it lost may shrink what some reach."""
        now, then = self._next(module), last._edges[module]
        if now == then:
            return False
        reach = last._reach.get(module)
        return reach is None or not set(then) <= set(now) or not reach.issuperset(now)

    def closure(self, path: str, sources: Iterable[bytes | str]) -> dict[str, str]:
        """Each module ty can reach from the file ``path`` whose code is
        ``sources`` (the file as it is, and the code a fix writes into it),
        with what stands for it in the key (see the module)."""
        starts = [
            module
            for source in sources
            for module in _modules_of(_summary(source, self).imports, path)
        ]
        # How ty resolves the file's own package: which __init__ files exist.
        parts = path.split("/")[:-1]
        starts += [".".join(parts[:n]) + "/" for n in range(1, len(parts) + 1)]
        found = {id(part): part for part in map(self._reachable, dict.fromkeys(starts))}
        # The largest first; one inside another chosen adds nothing (a name
        # imported from a module of the cycle is a module of its own, absent).
        parts: list[frozenset[str]] = []
        for part in sorted(found.values(), key=len, reverse=True):
            if not any(part <= other for other in parts):
                parts.append(part)
        key = frozenset(map(id, parts))  # each kept in self._reach: its id stands
        if key not in self._closures and key in self._earlier:
            found, since = self._earlier.pop(key)
            kept = self._closures[key] = Closure(found)
            kept.order = found.order
            for module in since & kept.keys():
                kept[module] = self._state(module)
        if key not in self._closures:  # most files share vLLM's one cycle
            reached = frozenset().union(*parts)
            self._closures[key] = Closure(
                (
                    module,
                    self._inits(module[:-1])
                    if module.endswith("/")  # a package on the way: its files
                    else self._state(module),
                )
                for module in reached
            )
        return self._closures[key]

    def _reachable(self, start: str) -> frozenset[str]:
        """Every module (and package on the way) ty may read from ``start``,
        itself included. Most of vLLM is one cycle of imports, so each
        strongly connected component's answer is worked out once and kept
        for every module in it (Tarjan's algorithm, without recursion: a
        chain of imports is deeper than Python's stack)."""
        reach = self._reach
        if start in reach:
            return reach[start]
        order: dict[str, int] = {start: 0}
        low: dict[str, int] = {start: 0}
        stack, on_stack = [start], {start}
        work = [(start, iter(self._successors(start)))]
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor in reach:  # a component already complete
                    continue
                if successor not in order:
                    order[successor] = low[successor] = len(order)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(self._successors(successor))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], order[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == order[node]:
                    self._complete(node, stack, on_stack)
        return reach[start]

    def _complete(self, root: str, stack: list[str], on_stack: set[str]) -> None:
        """The component whose root is ``root`` (the top of ``stack`` down
        to it): what its modules reach, kept for each."""
        members: list[str] = []
        while True:
            member = stack.pop()
            on_stack.discard(member)
            members.append(member)
            if member == root:
                break
        found = set(members)
        for member in members:
            for successor in self._successors(member):
                if successor not in found:
                    found |= self._reach[successor]
        reached = frozenset(found)
        for member in members:
            self._reach[member] = reached

    def _successors(self, module: str) -> list[str]:
        """A package on the way stands by its files' existence: nothing
        further is read from it."""
        return [] if module.endswith("/") else self._next(module)

    def _next(self, module: str) -> list[str]:
        """What ty may read next from ``module``: the modules its files
        import, and the packages on its way."""
        if module not in self._edges:
            found = [
                named
                for relpath in _candidates(module)
                if (raw := self.files.get(relpath)) is not None
                for named in _named_by(relpath, raw, self)
            ]
            parts = module.split(".")
            found += [".".join(parts[:n]) + "/" for n in range(1, len(parts))]
            self._edges[module] = found
        return self._edges[module]

    def digest(self, path: str, sources: Iterable[bytes | str]) -> str:
        return digest_of(self.closure(path, sources))

    def _state(self, module: str) -> str:
        if module not in self._modules:
            present = [
                f"{relpath}={_summary(self.files[relpath], self).code}"
                for relpath in _candidates(module)
                if relpath in self.files
            ]
            folder = module.replace(".", "/") + "/"
            self._modules[module] = " ".join(present) or (
                "namespace" if folder in self.folders else "absent"
            )
        return self._modules[module]

    def _inits(self, package: str) -> str:
        if package not in self._init_files:
            folder = package.replace(".", "/")
            self._init_files[package] = " ".join(
                name
                for name in ("__init__.py", "__init__.pyi")
                if f"{folder}/{name}" in self.files
            )
        return self._init_files[package]


def _folders(files: Iterable[str]) -> frozenset[str]:
    """Every folder on the way to each of ``files`` (``vllm/``, ``vllm/a/``)."""
    found = {relpath.rsplit("/", 1)[0] + "/" for relpath in files if "/" in relpath}
    return frozenset(
        {
            folder[: i + 1]
            for folder in found
            for i, char in enumerate(folder)
            if char == "/"
        }
        | found
    )


def _without(kept: dict[str, Any], changed: set[str]) -> dict[str, Any]:
    """A copy of ``kept`` without the keys in ``changed``."""
    copy = dict(kept)
    for key in changed:
        copy.pop(key, None)
    return copy


class Closure(dict[str, str]):
    """What :meth:`ModuleIndex.closure` found, shared by every file whose
    imports join the same components: read it, never change it. Its digest
    and its modules' order are worked out once."""

    digest: str = ""
    #: Its modules, sorted.
    order: list[str] | None = None


def digest_of(found: Mapping[str, str]) -> str:
    """The digest of what a closure found (:meth:`ModuleIndex.closure`)."""
    if isinstance(found, Closure) and found.digest:
        return found.digest
    # The modules in order are a closure's own (a kept closure has the
    # same), and one update of the whole text hashes the same bytes as one
    # per module: a third of the cost for vLLM's 4,500 modules.
    order = found.order if isinstance(found, Closure) and found.order else sorted(found)
    if isinstance(found, Closure):
        found.order = order
    digest = hashlib.sha256(_SCHEMA.encode())
    digest.update("".join(f"{module}\0{found[module]}\0" for module in order).encode())
    if isinstance(found, Closure):
        found.digest = digest.hexdigest()
    return digest.hexdigest()


def reads_file(found: Mapping[str, str], relpath: str, appears: bool) -> bool:
    """Whether what a closure (:meth:`ModuleIndex.closure`) found depends on
    the file ``relpath``: on its bytes where its module (or, for an
    ``__init__``, its package on the way) is in it; with ``appears`` (the
    file exists in one state of the tree and not in the other), on its
    existence where a package on its way is in it too (a new folder makes a
    namespace package of an absent module)."""
    module = _module_of(relpath)
    if module in found or f"{module}/" in found:
        return True
    if not appears:
        return False
    parts = module.split(".")
    return any(
        ".".join(parts[:n]) in found or ".".join(parts[:n]) + "/" in found
        for n in range(1, len(parts))
    )


def files_read(closures: Iterable[Mapping[str, str]]) -> set[str]:
    """The files whose bytes any of ``closures`` holds (every file of each
    module in one; a package on the way stands by its files' existence):
    the modules joined first, as the closures of a batch share most."""
    modules: set[str] = set()
    for found in closures:
        modules.update(found)
    return {
        relpath
        for module in modules
        if not module.endswith("/")
        for relpath in _candidates(module)
    }


#: The index made last in this process (see ``ModuleIndex._inherit``).
_LAST: list[ModuleIndex] = []


def _module_of(relpath: str) -> str:
    """The module a file of the package is one of the files of."""
    module = relpath.rsplit(".", 1)[0]
    return module.removesuffix("/__init__").replace("/", ".")


#: The modules each file names, by path and content: an overlay's next
#: state shares all but a few files' bytes (the same objects) with the last.
_NAMED_BY: dict[tuple[str, bytes], list[str]] = {}


def _named_by(relpath: str, raw: bytes, index: ModuleIndex) -> list[str]:
    key = (relpath, raw)  # a bytes object keeps its hash: cheap the second time
    if key not in _NAMED_BY:
        _NAMED_BY[key] = _modules_of(_summary(raw, index).imports, relpath)
    return _NAMED_BY[key]


@functools.cache
def _candidates(module: str) -> tuple[str, ...]:
    base = module.replace(".", "/")
    return (f"{base}.pyi", f"{base}.py", f"{base}/__init__.pyi", f"{base}/__init__.py")


def _modules_of(imports: Iterable[Import], relpath: str) -> list[str]:
    """The ``vllm`` modules the imports of the file ``relpath`` may name: a
    dotted path's every prefix for ``import a.b``, and for ``from m import
    n`` the module and ``m.n`` (a submodule, where there is one)."""
    found = []
    for level, module, names in imports:
        base = absolute_module(module, level, relpath) if level else module
        if level == 0 and not names:  # import a.b.c: binds a, a.b, a.b.c
            parts = base.split(".")
            found += [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
            continue
        found.append(base)
        found += [f"{base}.{name}" for name in names if name != "*"]
    return [m for m in found if m == "vllm" or m.startswith("vllm.")]


def _summary(source: bytes | str, index: ModuleIndex) -> Summary:
    """The file's import list (:func:`.import_lists.summary`), counted in
    ``index.scanned`` where it was scanned here."""
    found, scanned = import_lists.summary(source)
    index.scanned += scanned
    return found

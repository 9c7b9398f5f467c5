"""The checks of bench/corpus_judge.py that ask whether a written file can
run on its release: ``types`` (ty's new errors), ``envs`` (names
``vllm/envs.py`` declares) and ``attributes`` (names the release defines
somewhere). Each takes the release tree, the pristine and the written copies
of the patch's files, and the written paths; each returns what is wrong, as
lines naming the file. What they count is said in corpus_judge's docstring.

Like the judge, they share no code with the engine: files, ``ast`` and ty's
output only. ty is a bench requirement (``pip install ty``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path


def _new(before: Counter, after: Counter) -> list[tuple[str, str]]:
    return sorted((after - before).elements())


def _text(file: Path) -> str:
    return file.read_text(encoding="utf-8") if file.is_file() else ""


# -- types: ty's new errors ----------------------------------------------------

#: ty's diagnostics on the release's own files, by (tree, path): each file of
#: a release is checked once per process.
_PRISTINE_TYPES: dict[tuple[Path, str], Counter] = {}


def ty_available() -> bool:
    result = subprocess.run(
        [sys.executable, "-m", "ty", "--version"], capture_output=True, text=True
    )
    return result.returncode == 0


def type_wrongs(tree: Path, ours: Path, written: list[str]) -> list[str] | None:
    """ty's errors on each written file that the release's file does not
    have; None without ty. The written files are checked in a copy of the
    release tree (hard links) with all of them in place, so that one
    written file sees what another adds."""
    if not ty_available():
        return None
    with tempfile.TemporaryDirectory(dir=ours.parent) as scratch:
        patched = Path(scratch) / "tree"
        shutil.copytree(tree, patched, copy_function=_link_or_copy)
        for path in written:
            (patched / path).unlink(missing_ok=True)
            shutil.copyfile(ours / path, patched / path)
        wrongs = []
        for path in written:
            key = (tree, path)
            if key not in _PRISTINE_TYPES:
                _PRISTINE_TYPES[key] = _ty_errors(tree, path)
            new = _new(_PRISTINE_TYPES[key], _ty_errors(patched, path))
            wrongs += [f"{path}: ty {rule}: {message}" for rule, message in new]
    return wrongs


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def _ty_errors(root: Path, path: str) -> Counter:
    """ty's error diagnostics on ``root/path`` as (rule, message), without
    their lines; an unresolved import of a module outside vllm left out."""
    result = subprocess.run(
        [sys.executable, "-m", "ty", "check", "--project", str(root),
         "--config-file", str(_empty_config()),
         "--python", sys.executable, "--output-format", "gitlab",
         "--exit-zero", "--color", "never", path],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    try:
        found = json.loads(result.stdout)
    except ValueError:
        return Counter({("ty", (result.stdout + result.stderr).strip()[:200]): 1})
    lines = (root / path).read_text(encoding="utf-8").splitlines()
    errors: Counter = Counter()
    for diagnostic in found:
        rule = diagnostic["check_name"]
        message = diagnostic["description"].removeprefix(f"{rule}: ")
        if diagnostic.get("severity") not in ("major", "critical", "blocker"):
            continue  # a warning or a note
        if diagnostic["location"]["path"] != path:
            continue
        if _ignored(lines, diagnostic["location"]["positions"]):
            continue  # the author's `# type: ignore[...]`, as mypy reads it
        if rule in ("unresolved-import", "import-not-found") and not _names_vllm(
            message
        ):
            continue  # torch and the other third-party packages are absent
        errors[(rule, message)] += 1
    return errors


@functools.cache
def _empty_config() -> Path:
    """A ty.toml with ty's defaults, for every release alike: not the tree's
    own ``[tool.ty]``, whose settings are about vLLM's checkout (a ``.venv``,
    ignore files) and which ty 0.0.108 cannot load on 0.13.0 (``src.root``)."""
    path = Path(tempfile.mkdtemp(prefix="judge-ty-")) / "ty.toml"
    path.write_text("")
    return path


def _ignored(lines: list[str], positions: dict) -> bool:
    """A ``# type: ignore`` comment (any codes) on a line of the diagnostic:
    vLLM's authors suppress an error mypy reports so; ty honours the comment
    only where its codes are ty's."""
    first, last = positions["begin"]["line"], positions["end"]["line"]
    return any("# type: ignore" in line for line in lines[first - 1 : last])


def _names_vllm(message: str) -> bool:
    """A message that quotes a vllm module (`vllm.x`)."""
    return any(
        quoted == "vllm" or quoted.startswith("vllm.")
        for quoted in message.split("`")[1::2]
    )


# -- envs: names vllm/envs.py declares -----------------------------------------

_DECLARED_ENVS: dict[Path, set[str] | None] = {}


def envs_wrongs(
    tree: Path, pristine: Path, ours: Path, written: list[str]
) -> list[str]:
    """``envs.X`` the write newly reads that the release does not declare."""
    if tree not in _DECLARED_ENVS:
        _DECLARED_ENVS[tree] = declared_envs(tree / "vllm" / "envs.py")
    declared = _DECLARED_ENVS[tree]
    if declared is None:
        return []  # no vllm/envs.py: nothing to hold the names to
    wrongs = []
    for path in written:
        before = _envs_reads(_text(pristine / path), path)
        for name in sorted(_envs_reads(_text(ours / path), path) - before):
            if name not in declared:
                wrongs.append(
                    f"{path}: reads envs.{name}, which this release's "
                    "vllm/envs.py does not declare"
                )
    return wrongs


def declared_envs(envs_file: Path) -> set[str] | None:
    """The names ``vllm/envs.py`` declares: bound at its top level (in
    ``if``/``try`` blocks too: ``if TYPE_CHECKING:``), and the keys of its
    ``environment_variables`` dict."""
    if not envs_file.is_file():
        return None
    module = ast.parse(envs_file.read_text(encoding="utf-8"))
    declared = set(_top_level_names(module.body))
    for node in ast.walk(module):
        match node:
            case ast.Assign(targets=[ast.Name(id="environment_variables")]) | (
                ast.AnnAssign(target=ast.Name(id="environment_variables"))
            ) if isinstance(node.value, ast.Dict):
                declared.update(
                    key.value
                    for key in node.value.keys
                    if isinstance(key, ast.Constant) and isinstance(key.value, str)
                )
    return declared


def _top_level_names(body: list[ast.stmt]) -> list[str]:
    names: list[str] = []
    for node in body:
        match node:
            case (
                ast.FunctionDef(name=n)
                | ast.AsyncFunctionDef(name=n)
                | ast.ClassDef(name=n)
            ):
                names.append(n)
            case ast.Import(names=aliases) | ast.ImportFrom(names=aliases):
                names += [(a.asname or a.name).split(".")[0] for a in aliases]
            case ast.Assign(targets=targets):
                names += [n.id for t in targets for n in _stored_names(t)]
            case ast.AnnAssign(target=target) | ast.AugAssign(target=target):
                names += [n.id for n in _stored_names(target)]
            case ast.If() | ast.Try():
                for block in ("body", "orelse", "finalbody"):
                    names += _top_level_names(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    names += _top_level_names(handler.body)
    return names


def _stored_names(target: ast.AST) -> list[ast.Name]:
    return [n for n in ast.walk(target) if isinstance(n, ast.Name)]


def _envs_reads(text: str, path: str) -> set[str]:
    """The names read off ``vllm.envs`` (``envs.X`` through any import of
    it, ``vllm.envs.X``, ``from vllm.envs import X``)."""
    try:
        module = ast.parse(text)
    except SyntaxError:
        return set()
    aliases, reads = set(), set()
    for node in ast.walk(module):
        match node:
            case ast.ImportFrom(names=names, level=level, module=name):
                full = _absolute(path, level, name)
                if full == "vllm.envs":
                    reads.update(a.name for a in names)
                elif full == "vllm":
                    aliases.update(
                        a.asname or a.name for a in names if a.name == "envs"
                    )
            case ast.Import(names=names):
                aliases.update(
                    a.asname for a in names if a.name == "vllm.envs" and a.asname
                )
    for node in ast.walk(module):
        match node:
            case ast.Attribute(value=ast.Name(id=root), attr=attr, ctx=ast.Load()) if (
                root in aliases
            ):
                reads.add(attr)
            case ast.Attribute(
                value=ast.Attribute(value=ast.Name(id="vllm"), attr="envs"),
                attr=attr,
                ctx=ast.Load(),
            ):
                reads.add(attr)
    return reads


def _absolute(path: str, level: int, module: str | None) -> str:
    """The module an import names, relative ones resolved from ``path``."""
    if not level:
        return module or ""
    package = path.removesuffix(".py").split("/")[:-1]
    if path.endswith("/__init__.py"):
        package = path.split("/")[:-1]
    base = package[: len(package) - level + 1]
    return ".".join([*base, *([module] if module else [])])


# -- attributes: names the release defines somewhere ---------------------------

#: Bump when what counts as defined or read changes: the cache is stale then.
_NAMES_VERSION = 2  # 2: getattr(x, "NAME") is a read
_RELEASE_NAMES: dict[Path, tuple[set[str], set[str]]] = {}
#: Standard library modules whose classes' attributes a file may read off
#: objects it gets (a stream's ``isatty``, a logger's ``warning``).
_STDLIB = (
    "builtins", "io", "os", "pathlib", "logging", "threading", "collections",
    "asyncio", "re", "enum", "datetime", "functools", "subprocess", "socket",
    "queue", "contextlib", "itertools", "weakref", "types", "inspect",
    "dataclasses", "concurrent.futures", "argparse", "json", "typing", "uuid",
    "tempfile", "signal", "traceback", "string", "copy", "abc", "zipfile",
    "tarfile", "hashlib", "struct", "array", "decimal", "fractions",
    "multiprocessing", "selectors", "ssl", "http.client", "urllib.parse",
    "importlib.util", "importlib.machinery",
)  # fmt: skip


def _stdlib_attributes() -> set[str]:
    """The attribute names of the standard library's classes (those of
    _STDLIB): vllm never has to define them. A class's ``dir`` lacks what
    its ``__init__`` sets (``ModuleSpec.origin``, what ``find_spec``
    returns), so the source of the module that defines each class is read
    too, as a release's own files are (``_defined_in``)."""
    import importlib
    import inspect

    names: set[str] = set()
    sources: set[str] = set()
    for module_name in _STDLIB:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, type):
                names.update(dir(value))
                with contextlib.suppress(TypeError, OSError):
                    sources.add(inspect.getsourcefile(value) or "")
    for source in sorted(sources - {""}):
        with contextlib.suppress(OSError, SyntaxError):
            names |= _instance_attributes(Path(source).read_text(encoding="utf-8"))
    return names


def _instance_attributes(text: str) -> set[str]:
    """What the methods of a file's classes set on ``self``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        match node:
            case ast.ClassDef(body=body):
                for statement in body:
                    for inner in ast.walk(statement):
                        match inner:
                            case ast.Attribute(
                                value=ast.Name(id="self"), attr=attr, ctx=ast.Store()
                            ):
                                names.add(attr)
    return names


_STDLIB_ATTRIBUTES = _stdlib_attributes()


def attribute_wrongs(
    tree: Path, pristine: Path, ours: Path, written: list[str]
) -> tuple[list[str], list[str]]:
    """The attribute names the write newly reads that are defined nowhere:
    wrong where the release reads them nowhere either, noted (the second
    list) where it reads them elsewhere."""
    defined, read = release_names(tree)
    for path in written:
        defined = defined | _defined_in(_text(ours / path))
    wrongs, external = [], []
    for path in written:
        after = _text(ours / path)
        new = _attribute_reads(after, path) - _attribute_reads(
            _text(pristine / path), path
        )
        new -= _asked_for(after)  # the write itself allows for its absence
        for name in sorted(new - defined - _STDLIB_ATTRIBUTES):
            if name in read:
                external.append(f"{path}: .{name} (read elsewhere, defined nowhere)")
            else:
                wrongs.append(
                    f"{path}: reads the attribute `{name}`, which this release "
                    "defines nowhere (and reads nowhere) under vllm/"
                )
    return wrongs, external


def release_names(tree: Path) -> tuple[set[str], set[str]]:
    """The attribute names the release's ``vllm/`` defines, and those it
    reads; computed once per release, kept beside the tree."""
    if tree in _RELEASE_NAMES:
        return _RELEASE_NAMES[tree]
    cache = tree.parent / f"{tree.name}.attribute-names.json"
    try:
        stored = json.loads(cache.read_text())
        assert stored["version"] == _NAMES_VERSION
        names = set(stored["defined"]), set(stored["read"])
    except (OSError, ValueError, KeyError, AssertionError):
        defined: set[str] = set()
        read: set[str] = set()
        for file in sorted((tree / "vllm").rglob("*.py")):
            text = file.read_text(encoding="utf-8", errors="replace")
            defined |= _defined_in(text)
            read |= _attribute_reads(text, str(file.relative_to(tree)))
            read |= _getattr_reads(text)
        names = defined, read
        document = {"version": _NAMES_VERSION, "defined": sorted(defined)}
        document["read"] = sorted(read)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(document))
        partial.replace(cache)
    _RELEASE_NAMES[tree] = names
    return names


def _defined_in(text: str) -> set[str]:
    """Attribute names a file defines: ``x.NAME = ...`` anywhere, a def or
    class anywhere, a name bound at the top level of the module or of a
    class body (fields, class attributes), ``setattr(x, "NAME", ...)``."""
    try:
        module = ast.parse(text)
    except SyntaxError:
        return set()
    defined = set(_top_level_names(module.body))
    for node in ast.walk(module):
        match node:
            case ast.FunctionDef(name=n) | ast.AsyncFunctionDef(name=n):
                defined.add(n)
            case ast.ClassDef(name=n, body=body):
                defined.add(n)
                defined.update(_top_level_names(body))
            case ast.Attribute(attr=attr, ctx=ast.Store() | ast.Del()):
                defined.add(attr)
            case ast.Call(
                func=ast.Name(id="setattr"), args=[_, ast.Constant(value=str(n)), *_]
            ):
                defined.add(n)
    return defined


def _getattr_reads(text: str) -> set[str]:
    """The names a file reads as ``getattr(x, "NAME"[, default])``: the
    release reads them too (0.20.2 reads torch's
    ``_non_persistent_buffers_set`` so, which vllm#42481 reads as an
    attribute)."""
    return _named_in_calls(text, "getattr", (2, 3))


def _asked_for(text: str) -> set[str]:
    """The names a file asks ``hasattr(x, "NAME")`` of: it reads them only
    where they are there (vllm#47690's ``elif hasattr(layer, "ark_linear")``)."""
    return _named_in_calls(text, "hasattr", (2,))


def _named_in_calls(text: str, function: str, arities: tuple[int, ...]) -> set[str]:
    """The string second arguments of the file's calls of the builtin
    ``function`` with one of ``arities`` arguments."""
    try:
        module = ast.parse(text)
    except SyntaxError:
        return set()
    return {
        node.args[1].value
        for node in ast.walk(module)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == function
        and len(node.args) in arities
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    }


def _attribute_reads(text: str, path: str) -> set[str]:
    """Attribute names read in a file, except those read off a module or a
    name imported from outside vllm (``torch.x``, ``PretrainedConfig.x``)."""
    try:
        module = ast.parse(text)
    except SyntaxError:
        return set()
    outside: set[str] = set()
    for node in ast.walk(module):
        match node:
            case ast.Import(names=names):
                outside.update(
                    (a.asname or a.name).split(".")[0]
                    for a in names
                    if a.name.split(".")[0] != "vllm"
                )
            case ast.ImportFrom(names=names, level=level, module=name):
                full = _absolute(path, level, name)
                if full.split(".")[0] != "vllm":
                    outside.update(a.asname or a.name for a in names)
    reads = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in outside):
                reads.add(node.attr)
    return reads

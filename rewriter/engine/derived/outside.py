"""Attributes that are there at run time although vLLM's code never names
them (issue 40, item 4): :mod:`.runtime` refuses a fix whose code reads an
attribute the release lacks, and asks this module first whether the
attribute comes from outside vLLM.

Three such cases, each read off the release's own code or the fix's,
never guessed:

- **inherited from a class outside vLLM**: the fix reads ``self.name`` (or
  ``self.inherited.name``) in a method of a class one of whose bases, its
  own or a vLLM base's, resolves through the file's imports to a module
  not under ``vllm`` (``argparse.ArgumentParser``,
  ``transformers.ProcessorMixin``), and no vLLM class on the way defines
  ``name`` (a definition, a class-level name, a ``self.name =``). Where
  this Python holds that module's source (the standard library), the name
  must be in it. A dependency of vLLM is not installed beside this tool:
  what its object holds (``self.tokenizer.add_tokens``, ``tokenizer``
  being the dependency's) is taken as there, but not ``self.name`` itself,
  which looks the same as a field of the vLLM subclass that a later change
  added (a transformers config's). ``torch`` is never such a base: an
  ``nn.Module`` answers the submodules and parameters that vLLM's own
  code registers, which are vLLM's attributes, not torch's.
- **a local the fix annotates with a class outside vLLM**: ``model:
  PreTrainedModel = AutoModel.from_config(...)`` then ``model.get_decoder()``
  (vllm#30518), the class imported by the file from a dependency: what its
  object holds is taken as there, as above (:func:`annotated`).
- **an open interface**: ty says a type has no such attribute, and that
  type is a ``Protocol`` (any object with the right methods is one: vLLM's
  ``TokenizerLike`` is at run time a Hugging Face tokenizer), or an
  abstract class (``ABC``) that no class in vLLM derives from, so its
  implementations live elsewhere. A concrete vLLM class (``ModelConfig``)
  or an abstract one that vLLM implements is never open.
- **a mixin's attribute**: ty reads a mixin class alone, so ``self.name`` in
  a method of a vLLM class that does not define ``name`` is missing to it
  (vllm#30518 reads ``self.check_version`` in ``MultiModalMixin``). At run
  time ``self`` is an object of a class that mixes it in: where at least
  one vLLM class derives from the mixin, and every one that does defines
  ``name`` itself or through its vLLM bases (``Base`` defines
  ``check_version``), the name is there (:func:`mixed_in`). A mixin no
  class derives from, or one class that lacks the name, is still refused.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deepstack_patch.engine.context import tree_context
from deepstack_patch.engine.derived import shapes
from deepstack_patch.engine.derived.names import absolute_module

#: The modules whose classes add no attribute a fix may read (``Generic``,
#: ``Protocol``, ``ABC``) and whose text would name any word.
_NO_ATTRIBUTES = frozenset({"typing", "typing_extensions", "abc", "builtins"})

#: The packages whose classes never make an attribute present (see above).
_NEVER_OUTSIDE = frozenset({"torch"})

#: How many classes deep a class's vLLM bases are followed.
_DEPTH = 8


@dataclass
class Sources:
    """The release's ``vllm`` package, by relative path (the file being
    recognised as the plan hands it over, where it is one of them), and
    what was parsed of it."""

    files: Mapping[str, bytes]
    #: Each file's bytes when it was parsed, and what they parsed to.
    parsed: dict[str, tuple[bytes | None, ast.Module | None]] = field(
        default_factory=dict
    )
    #: Where given, every file read here is added (the plan's
    #: :attr:`~deepstack_patch.engine.context.TreeContext.probed`).
    probed: set[str] | None = None

    def module(self, relpath: str) -> ast.Module | None:
        if self.probed is not None:
            self.probed.add(relpath)
        raw = self.files.get(relpath)
        known = self.parsed.get(relpath)
        if known is None or known[0] is not raw:  # new, or rewritten since
            try:
                module = ast.parse(raw) if raw is not None else None
            except (SyntaxError, ValueError):
                module = None
            known = self.parsed[relpath] = (raw, module)
        return known[1]

    def module_path(self, dotted: str) -> str | None:
        """The file of the ``vllm`` module ``dotted`` (a.b -> a/b.py)."""
        base = dotted.replace(".", "/")
        for relpath in (f"{base}.py", f"{base}/__init__.py"):
            if relpath in self.files:
                return relpath
        return None


# -- inherited from a class outside vLLM ---------------------------------------------


def inherited(node: ast.Attribute, class_name: str, path: str, sources: Sources) -> str:
    """The class outside vLLM that ``node`` (``self.name`` or
    ``self.inherited.name``, read in a method of the class ``class_name``
    of ``path``) is an attribute of, dotted; empty where it is not one."""
    chain: list[str] = []
    value: ast.expr = node
    while isinstance(value, ast.Attribute):
        chain.insert(0, value.attr)
        value = value.value
    if not (isinstance(value, ast.Name) and value.id == "self") or len(chain) > 2:
        return ""
    hierarchy = _hierarchy(sources, path, class_name.split("."), 0)
    if hierarchy is None or not hierarchy.outside:
        return ""
    # ``self.inherited.name``: ``inherited`` is the outside class's, so
    # what it holds is an object vLLM does not define either.
    first = chain[0]
    if first in hierarchy.defined:
        return ""
    for base in hierarchy.outside:
        # ``self.name`` itself only where the base's source names it: on a
        # dependency's class it looks the same as a vLLM subclass's field
        # that a later change added (a transformers config's).
        if _may_define(base, first, trusted=len(chain) > 1):
            return base
    return ""


def annotated(
    node: ast.Attribute,
    code: Iterable[ast.AST],
    path: str,
    sources: Sources,
    fix_imports: Iterable[ast.stmt] = (),
) -> str:
    """The class outside vLLM, dotted, that ``node`` (``name.attr``) is read
    on where the fix's own code annotates the local ``name`` with it, once
    (``model: PreTrainedModel = AutoModel.from_config(...)``, a parameter
    ``model: PreTrainedModel``) and the file imports that class from a module
    not under ``vllm``: what a dependency's object holds is taken as there,
    as ``self.tokenizer.add_tokens`` is; the standard library's where its
    source names it; ``fix_imports``: the import statements the fix writes
    in that file (vllm#30518 adds ``PreTrainedModel`` to an import under
    ``if TYPE_CHECKING:``). Empty where it is not one (an unannotated
    local, a union, a vLLM class, ``torch``)."""
    if not isinstance(node.value, ast.Name):
        return ""
    local = node.value.id
    annotations: list[str] = []
    for root in code:
        for inner in ast.walk(root):
            match inner:
                case (
                    ast.AnnAssign(target=ast.Name(id=name), annotation=annotation)
                    | ast.arg(arg=name, annotation=ast.expr() as annotation)
                ) if name == local:
                    annotations.append(_dotted(annotation))
    if len(set(annotations)) != 1 or "" in annotations:
        return ""  # none, one that is not a plain class, or several
    module = sources.module(path)
    if module is None:
        return ""
    head, _, rest = annotations[-1].partition(".")
    # An annotation's class may be imported for the type checker alone.
    imports = _imports(module, path, for_annotations=True)
    imports.update(_imports(ast.Module(list(fix_imports), []), path, True))
    if head not in imports:
        return ""
    full = f"{imports[head]}.{rest}" if rest else imports[head]
    top = full.split(".")[0]
    if top == "vllm" or top in _NEVER_OUTSIDE or top in _NO_ATTRIBUTES:
        return ""
    return full if _may_define(full, node.attr, trusted=True) else ""


@dataclass(frozen=True)
class _Hierarchy:
    #: Its bases outside vLLM, dotted, its vLLM bases' included.
    outside: tuple[str, ...]
    #: The names its vLLM classes define.
    defined: frozenset[str]


def _hierarchy(
    sources: Sources, path: str, qualname: list[str], depth: int
) -> _Hierarchy | None:
    """The class ``qualname`` of ``path`` and its bases; None where it or a
    base cannot be read (then nothing is taken as inherited)."""
    module = sources.module(path)
    if module is None or depth > _DEPTH:
        return None
    found = shapes.class_named(module.body, qualname)
    if found is None:
        return None
    outside: list[str] = []
    defined = shapes.class_defines(found)
    imports = _imports(module, path)
    for base in found.bases:
        # ``Base[T]`` is ``Base``; a call or another expression is not read.
        dotted = _dotted(base.value if isinstance(base, ast.Subscript) else base)
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        if dotted == "object":
            continue
        if not rest and shapes.class_named(module.body, [head]) is not None:
            where, name = path, [head]  # a class of the same file
        elif head in imports:
            full = f"{imports[head]}.{rest}" if rest else imports[head]
            top = full.split(".")[0]
            if top != "vllm":
                if top not in _NEVER_OUTSIDE and top not in _NO_ATTRIBUTES:
                    outside.append(full)
                continue
            owner, _, last = full.rpartition(".")
            relpath = sources.module_path(owner)
            if relpath is None:
                return None
            where, name = relpath, [last]
        else:
            return None  # a name neither imported nor defined: not read
        inner = _hierarchy(sources, where, name, depth + 1)
        if inner is None:
            return None
        outside += inner.outside
        defined |= inner.defined
    return _Hierarchy(tuple(dict.fromkeys(outside)), frozenset(defined))


def _imports(
    module: ast.Module, path: str, for_annotations: bool = False
) -> dict[str, str]:
    """Name -> the dotted module or object the file's top-level imports bind
    (``for_annotations``: those under ``if TYPE_CHECKING:`` too)."""
    found: dict[str, str] = {}
    statements = list(module.body)
    if for_annotations:
        for node in module.body:
            match node:
                case ast.If(
                    test=ast.Name(id="TYPE_CHECKING")
                    | ast.Attribute(attr="TYPE_CHECKING"),
                    body=body,
                ):
                    statements += body
    for node in statements:
        match node:
            case ast.Import(names=names):
                for alias in names:
                    if alias.asname:
                        found[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        found[top] = top
            case ast.ImportFrom(module=name, level=level, names=names):
                origin = absolute_module(name or "", level or 0, path)
                for alias in names:
                    found[alias.asname or alias.name] = f"{origin}.{alias.name}"
    return found


def _dotted(node: ast.expr) -> str:
    match node:
        case ast.Name(id=name):
            return name
        case ast.Attribute(value=value, attr=attr):
            inner = _dotted(value)
            return f"{inner}.{attr}" if inner else ""
    return ""


def _may_define(base: str, name: str, *, trusted: bool) -> bool:
    """Whether the class ``base`` (dotted, outside vLLM) may have ``name``:
    where this Python holds its module's source (the standard library), the
    name is in it; elsewhere (a dependency of vLLM, not installed beside
    this tool) it may where ``trusted``."""
    top = base.split(".")[0]
    if top not in sys.stdlib_module_names:
        return trusted
    return mentions(name, _standard_sources(top))


def _standard_sources(top: str) -> list[bytes]:
    """The source files of the standard library's module ``top``."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    origin = Path(spec.origin)
    files = (
        sorted(origin.parent.rglob("*.py"))
        if spec.submodule_search_locations
        else [origin]
    )
    found = []
    for file in files:
        try:
            found.append(file.read_bytes())
        except OSError:
            continue
    return found


#: The files of the package a search for a name reads (:mod:`.runtime`'s
#: package): a name held only by another file (a JSON key) is not found
#: there, and such a file vouches for no name (:mod:`..plan_memo`).
SEARCHED_SUFFIXES = (".py", ".pyi")


def mentions(name: str, raws: Iterable[bytes]) -> bool:
    """Whether code defines ``name`` or reads it as an attribute: read off
    its text (a definition or a read anywhere, a comment's aside)."""
    evidence_in = _noted(name.encode())
    return any(evidence_in(raw) for raw in raws)


def first_mention(
    name: str,
    files: Iterable[tuple[str, bytes]],
    by_path: Mapping[str, bytes] | None = None,
) -> str | None:
    """A file of ``files`` (path, text) whose code defines ``name`` or reads
    it as an attribute (as :func:`mentions` tells), None where none does:
    the first in their order, or (given ``files`` ``by_path``) the one an
    earlier lookup of the plan found, where it holds the same bytes still (a
    name looked up in each state of a series; ``pts``, inside thousands of
    longer names, took 30 ms a lookup). A plan notes which
    (``TreeContext.first_mentioned``): a file that held it vouches for the
    answer where the plan is kept (plan_memo)."""
    word = name.encode()
    evidence_in = _noted(word)
    context = tree_context()
    earlier = context.on_disk.get(("mentioned in", word)) if context else None
    if (
        by_path is not None
        and isinstance(earlier, tuple)
        and by_path.get(earlier[0]) is earlier[1]
    ):
        found: str | None = earlier[0]
    else:
        found = next((path for path, raw in files if evidence_in(raw)), None)
        if context is not None and found is not None and by_path is not None:
            context.on_disk[("mentioned in", word)] = found, by_path[found]
    if context is not None:
        context.first_mentioned.setdefault(word, set()).add(found)
    return found


def evidence_test(word: bytes) -> Callable[[bytes], bool]:
    """Whether a file's text defines ``word`` or reads it as an attribute
    (a definition or a read anywhere, a comment's aside)."""
    evidence = re.compile(
        rb"(?:\.\s*|\bdef\s+|\bclass\s+|['\"])"
        + re.escape(word)
        + rb"\b|\b"
        + re.escape(word)
        + rb"\s*(?::|=(?!=))"
    )

    def evidence_in(raw: bytes) -> bool:
        return word in raw and _evidence_in(raw, word, evidence)

    return evidence_in


def _noted(word: bytes) -> Callable[[bytes], bool]:
    """:func:`evidence_test`, noted as a search of the plan being made (a
    kept plan asks each file again: plan_memo)."""
    context = tree_context()
    if context is None:
        return evidence_test(word)
    noted = context.mentioned.get(word)
    if noted is None:
        noted = context.mentioned[word] = evidence_test(word)
    return noted


def _scanning_for(word: bytes) -> None:
    """Note that a search of the whole package looks at files holding
    ``word`` only (every such search here tests ``word in raw`` first)."""
    context = tree_context()
    if context is not None:
        context.scanned_for.add(word)


#: How far around an occurrence of the word its evidence is looked for.
_AROUND = 64

#: The bytes a pattern's ``\b`` counts as a word's (ASCII, as for bytes).
_WORD_BYTES = frozenset(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
)


def _evidence_in(raw: bytes, word: bytes, evidence: re.Pattern[bytes]) -> bool:
    """``evidence.search(raw)``, looked for around each occurrence of
    ``word`` only: the pattern starts with no literal, and searching a whole
    module for it was a sixth of a status of 40 derived patches. A match
    that ends at the window's end (a lookahead cut short) is tried again on
    the whole text, so the answer is the whole search's, or a refusal where
    evidence stood more than a window away from the word (never a false
    yes)."""
    start = raw.find(word)
    while start >= 0:
        # Inside a longer name (``pts`` in ``prompts``): evidence never
        # holds this occurrence (each form has a non-word byte before the
        # name and a boundary after it), and the window around it is
        # searched where another occurrence is reached. A name as common
        # as a part of other names was a tenth of a status's lookups.
        after = start + len(word)
        if (start and raw[start - 1] in _WORD_BYTES) or (
            after < len(raw) and raw[after] in _WORD_BYTES
        ):
            start = raw.find(word, start + 1)
            continue
        end = min(len(raw), start + len(word) + _AROUND)
        found = evidence.search(raw, max(0, start - _AROUND), end)
        if found is not None and (
            found.end() < end or end == len(raw) or evidence.match(raw, found.start())
        ):
            return True
        start = raw.find(word, start + 1)
    return False


# -- mixins ---------------------------------------------------------------------------


def mixed_in(class_name: str, path: str, name: str, sources: Sources) -> list[str]:
    """The vLLM classes that derive from the class ``class_name`` of
    ``path`` (a mixin that does not define ``name``), each of which defines
    ``name`` itself or through its vLLM bases; empty where no class derives
    from it, one lacks ``name``, or one cannot be read."""
    if "." in class_name:
        return []  # a nested class is no mixin another module names
    own = _hierarchy(sources, path, [class_name], 0)
    if own is None or name in own.defined:
        return []
    module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    _scanning_for(class_name.encode())
    derived = _deriving(class_name)
    mixing: list[str] = []
    for relpath, raw in sources.files.items():
        if class_name.encode() not in raw or not derived.search(raw):
            continue
        parsed = sources.module(relpath)
        if parsed is None:
            return []
        imports = _imports(parsed, relpath)
        for node in ast.walk(parsed):
            if not isinstance(node, ast.ClassDef) or not any(
                _names_class(base, class_name, module, relpath, path, imports, sources)
                for base in node.bases
            ):
                continue
            if node not in parsed.body:
                return []  # a nested class: its hierarchy is not read here
            hierarchy = _hierarchy(sources, relpath, [node.name], 0)
            if hierarchy is None or name not in hierarchy.defined:
                return []
            mixing.append(node.name)
    return mixing


def _deriving(class_name: str) -> re.Pattern[bytes]:
    """A class header that names ``class_name`` among its bases: a file
    without one holds no class deriving from it."""
    return re.compile(
        rb"\bclass\s+\w+\s*\([^)]*\b" + re.escape(class_name.encode()) + rb"\b"
    )


def _names_class(
    base: ast.expr,
    class_name: str,
    module: str,
    relpath: str,
    path: str,
    imports: Mapping[str, str],
    sources: Sources,
) -> bool:
    """Whether ``base`` (a base of a class in ``relpath``) is the class
    ``class_name`` of ``path`` (the dotted ``module``): the same file's, or
    imported from its module, or from a module that imports it from there
    (a package's ``__init__`` that re-exports it)."""
    dotted = _dotted(base.value if isinstance(base, ast.Subscript) else base)
    head, _, rest = dotted.partition(".")
    if dotted == class_name and relpath == path:
        return True
    if head not in imports:
        return False
    full = f"{imports[head]}.{rest}" if rest else imports[head]
    owner, _, last = full.rpartition(".")
    if last != class_name:
        return False
    if owner == module:
        return True
    via = sources.module_path(owner)
    via_module = sources.module(via) if via is not None else None
    return (
        via is not None
        and via_module is not None
        and _imports(via_module, via).get(class_name) == f"{module}.{class_name}"
    )


# -- open interfaces -------------------------------------------------------------------


def open_interface(owner: str, sources: Sources) -> bool:
    """Whether the type ty names ``owner`` (``TokenizerLike``, perhaps
    ``TokenizerLike | None``) is an interface whose objects at run time may
    come from outside vLLM (see the module's docstring): every class of
    that name in the package is one."""
    name = re.sub(r"\[.*\]$", "", _OR_NONE.sub("", owner)).rpartition(".")[2]
    if not re.fullmatch(r"\w+", name):
        return False
    _scanning_for(name.encode())
    definition = re.compile(rb"^\s*class\s+" + re.escape(name.encode()) + rb"\b", re.M)
    classes = [
        found
        for relpath, raw in sources.files.items()
        if name.encode() in raw
        and definition.search(raw)
        and (module := sources.module(relpath)) is not None
        for found in ast.walk(module)
        if isinstance(found, ast.ClassDef) and found.name == name
    ]
    return bool(classes) and all(_is_open(c, sources) for c in classes)


_OR_NONE = re.compile(r" \| None\b|\bNone \| ")


def _is_open(node: ast.ClassDef, sources: Sources) -> bool:
    bases = {
        _dotted(b.value if isinstance(b, ast.Subscript) else b) for b in node.bases
    }
    last = {base.rpartition(".")[2] for base in bases}
    if "Protocol" in last:
        return True
    metaclass = {_dotted(k.value).rpartition(".")[2] for k in node.keywords}
    if "ABC" not in last and "ABCMeta" not in metaclass:
        return False
    # Abstract: open only where no class of vLLM derives from it.
    _scanning_for(node.name.encode())
    derived = _deriving(node.name)
    return not any(
        node.name.encode() in raw and derived.search(raw)
        for raw in sources.files.values()
    )

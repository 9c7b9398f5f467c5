"""Issue 41 item 4: a typed verdict is keyed by the checked file and the
``vllm`` modules ty can reach from it (engine/derived/closure.py), not by
the whole package: an edit elsewhere keeps it, an edit on the way (however
deep) checks the patch again, and it is never stale."""

from __future__ import annotations

from pathlib import Path

import pytest
from deepstack_patch.engine.derived import closure, import_lists
from deepstack_patch.engine.protocol import PatchState

from tests.support.ty_runs import checks_handed_to_ty
from tests.test_derived_runtime import patch_of, report_of, whole_tree

#: vllm/toy.py reads ToyConfig (vllm/config.py), which gets its fields from
#: Base (vllm/base.py, relative and two levels from the checked file).
BASE = "class Base:\n    limit: int = 4\n"
CONFIG = "from .base import Base\n\n\nclass ToyConfig(Base):\n    pass\n"
TOY = """from vllm.config import ToyConfig


def check(config: ToyConfig):
    return config.limit
"""
FIXED = TOY.replace(
    "    return config.limit",
    "    if config.strict:\n        return 0\n    return config.limit",
)
#: A module toy.py does not reach (it names ``strict`` too: only ty tells).
OTHER = "class Pool:\n    strict: bool = True\n"


def test_an_edit_outside_the_closure_keeps_the_verdict_and_one_inside_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    runs = checks_handed_to_ty(monkeypatch)
    root = whole_tree(
        tmp_path / "tree",
        {
            "vllm/base.py": BASE,
            "vllm/config.py": CONFIG,
            "vllm/toy.py": TOY,
            "vllm/pool.py": OTHER,
        },
    )
    patch = patch_of("local#t", "vllm/toy.py", TOY, FIXED)
    assert report_of(root, patch).state is PatchState.DRIFTED
    assert len(runs) == 1
    # A module nothing on toy.py's way imports: the verdict is kept.
    (root / "vllm/pool.py").write_text(OTHER + "\n\ndef spare():\n    return 1\n")
    (root / "vllm/__init__.py").write_text("from vllm.pool import Pool\n")
    report = report_of(root, patch)
    assert report.state is PatchState.DRIFTED
    assert "`ToyConfig.strict`" in report.reason
    assert len(runs) == 1
    # Two levels down (toy -> config -> base): checked again, and not stale.
    (root / "vllm/base.py").write_text(BASE + "    strict: bool = False\n")
    assert report_of(root, patch).state is PatchState.NEEDED
    assert len(runs) == 2
    # Back as it was: the first verdict again, from the cache.
    (root / "vllm/base.py").write_text(BASE)
    assert report_of(root, patch).state is PatchState.DRIFTED
    assert len(runs) == 2


def index(files: dict[str, str]) -> closure.ModuleIndex:
    return closure.ModuleIndex({k: v.encode() for k, v in files.items()})


def reached(files: dict[str, str], path: str) -> set[str]:
    """The modules of ``files`` the closure of ``path`` holds as present."""
    found = index(files).closure(path, [files[path].encode()])
    return {m for m, state in found.items() if "=" in state}


def test_the_closure_follows_every_kind_of_static_import() -> None:
    files = {
        "vllm/__init__.py": "from vllm.everything import X\n",
        "vllm/everything.py": "",
        "vllm/a/__init__.py": "",
        "vllm/a/file.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from vllm.typed import T\n"
            "from . import sibling\n"
            "from ..b.mod import (\n    one,  # why ) here\n    two as three,\n)\n"
            "from vllm.star import *\n"
            "def f():\n    import vllm.lazy.deep as d\n"
        ),
        "vllm/typed.py": "from .deeper import D\n",
        "vllm/deeper.py": "",
        "vllm/a/sibling.py": "",
        "vllm/b/__init__.py": "",
        "vllm/b/mod.py": "",
        "vllm/star.py": "from vllm.starred import *\n",
        "vllm/starred.py": "",
        "vllm/lazy/__init__.py": "",
        "vllm/lazy/deep.py": "",
        "vllm/unread.py": "",
    }
    assert reached(files, "vllm/a/file.py") == {
        "vllm.typed",
        "vllm.deeper",
        "vllm.a",  # `from . import sibling` reads the package
        "vllm.a.sibling",
        "vllm.b.mod",
        "vllm.star",
        "vllm.starred",
        # `import vllm.lazy.deep` binds `vllm`: the package's body is read.
        "vllm",
        "vllm.everything",
        "vllm.lazy",
        "vllm.lazy.deep",
    }
    # Without a statement that names `vllm`, its __init__ is not read.
    files["vllm/a/file.py"] = "from vllm.b.mod import one\n"
    assert reached(files, "vllm/a/file.py") == {"vllm.b.mod"}


def test_a_module_that_appears_or_an_init_that_goes_is_a_new_key() -> None:
    files = {
        "vllm/__init__.py": "",
        "vllm/a/__init__.py": "",
        "vllm/a/file.py": "from vllm.b import gone\n",
        "vllm/b/__init__.py": "",
    }
    source = [files["vllm/a/file.py"].encode()]
    first = index(files).digest("vllm/a/file.py", source)
    assert index(files).digest("vllm/a/file.py", source) == first
    # `gone` becomes a submodule: ty resolves the import another way.
    assert index({**files, "vllm/b/gone.py": ""}).digest(
        "vllm/a/file.py", source
    ) not in (first,)
    # vllm/a becomes a namespace package.
    without = {k: v for k, v in files.items() if k != "vllm/a/__init__.py"}
    assert index(without).digest("vllm/a/file.py", source) != first
    # The fix's code imports more than the file: its modules count too.
    assert (
        index(files).digest("vllm/a/file.py", [*source, b"    import vllm.b.c\n"])
        != first
    )


def test_import_lists_are_scanned_once_per_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(tmp_path / "cache"))
    for memo in ("_KNOWN", "_NEW", "_BY_CONTENT"):
        monkeypatch.setattr(import_lists, memo, {})
    monkeypatch.setattr(closure, "_NAMED_BY", {})
    # A process's first index: none before it to take from (a later state
    # checks the imports of each module it changed that the last one read).
    monkeypatch.setattr(import_lists, "_LOADED", [])
    monkeypatch.setattr(closure, "_LAST", [])
    files = {
        "vllm/__init__.py": "",
        "vllm/one.py": "from vllm.two import x  # 41\n",
        "vllm/two.py": "x = 1  # 41\n",
    }
    first = index(files)
    first.closure("vllm/one.py", [files["vllm/one.py"].encode()])
    assert first.scanned == 2
    import_lists.save()
    # Another process: the lists come from the cache folder.
    for memo in ("_KNOWN", "_BY_CONTENT"):
        monkeypatch.setattr(import_lists, memo, {})
    monkeypatch.setattr(closure, "_NAMED_BY", {})
    monkeypatch.setattr(import_lists, "_LOADED", [])
    again = index(files)
    again.closure("vllm/one.py", [files["vllm/one.py"].encode()])
    assert again.scanned == 0
    # Another version of the scan (its module's code changed, as after an
    # upgrade): it reads none of the lists the older one kept.
    changed = tmp_path / "import_lists.py"
    changed.write_bytes(Path(import_lists.__file__).read_bytes() + b"# changed\n")
    monkeypatch.setattr(import_lists, "__file__", str(changed))
    import_lists._scanner_digest.cache_clear()
    for memo in ("_KNOWN", "_BY_CONTENT"):
        monkeypatch.setattr(import_lists, memo, {})
    monkeypatch.setattr(closure, "_NAMED_BY", {})
    monkeypatch.setattr(import_lists, "_LOADED", [])
    monkeypatch.setattr(closure, "_LAST", [])
    try:
        upgraded = index(files)
        upgraded.closure("vllm/one.py", [files["vllm/one.py"].encode()])
        assert upgraded.scanned == 2
    finally:
        monkeypatch.undo()
        import_lists._scanner_digest.cache_clear()


@pytest.mark.parametrize(
    ("source", "imports"),
    [
        ("import vllm.a.b as c, vllm.d\n", [(0, "vllm.a.b", ()), (0, "vllm.d", ())]),
        ("x = 1; import vllm.e\n", [(0, "vllm.e", ())]),
        ("if T: from vllm.f import g\n", [(0, "vllm.f", ("g",))]),
        ("from vllm.h import \\\n    i, j\n", [(0, "vllm.h", ("i", "j"))]),
        ("from ... import k\n", [(3, "", ("k",))]),
        # Where no statement starts, the words are not an import; one may
        # start inside them all the same.
        ("datafrom vllm.l import m\n", []),
        ('x = "import vllm.n: import vllm.o"\n', [(0, "vllm.o", ())]),
        ("# we import vllm.p; from vllm.q import r\n", [(0, "vllm.q", ("r",))]),
        # A statement is looked for where the word ``import`` is: its own
        # start, once, and never inside the statement found before it.
        ("from vllm.s import t  # import vllm.u\n", [(0, "vllm.s", ("t",))]),
        ("fromage import vllm.v\nimportlib.w\n", []),
        ("from vllm.x import (y,\n    import_z)\n", [(0, "vllm.x", ("y", "import_z"))]),
        ("a = {1: 2}; import vllm.aa\n", [(0, "vllm.aa", ())]),
    ],
)
def test_the_scan_finds_imports_a_line_scan_would_miss(
    source: str, imports: list[closure.Import]
) -> None:
    assert list(import_lists.summarise(source.encode()).imports) == imports


def test_a_later_state_of_the_overlay_hashes_none_of_the_files_it_shares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each patch that writes makes a new state (a new index) of a package
    whose other files are the same bytes: they are not hashed again."""
    files = {
        "vllm/__init__.py": b"",
        "vllm/one.py": b"from vllm.two import x  # shared\n",
        "vllm/two.py": b"x = 1  # shared\n",
    }
    closure.ModuleIndex(files).closure("vllm/one.py", [files["vllm/one.py"]])
    hashed: list[bytes] = []
    real = closure.hashlib.blake2b

    def counted(raw: bytes, **options: int):
        hashed.append(raw)
        return real(raw, **options)

    monkeypatch.setattr(closure.hashlib, "blake2b", counted)
    rewritten = {**files, "vllm/one.py": b"from vllm.two import x  # rewritten\n"}
    closure.ModuleIndex(rewritten).closure("vllm/one.py", [rewritten["vllm/one.py"]])
    assert hashed == [rewritten["vllm/one.py"]]


#: A package whose first module reads the second, which reads the third.
CHAIN = {
    "vllm/__init__.py": b"",
    "vllm/one.py": b"from vllm.two import x\n",
    "vllm/two.py": b"from vllm.three import y\nx = 1\n",
    "vllm/three.py": b"y = 1\n",
}


def test_a_later_state_takes_only_what_its_unchanged_modules_worked_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new index takes the last one's work on each module whose files did
    not change, and answers as an index made from nothing would."""
    files = {**CHAIN, "vllm/four.py": b"z = 1\n"}
    source = [files["vllm/one.py"]]
    monkeypatch.setattr(closure, "_LAST", [])
    closure.ModuleIndex(files).digest("vllm/one.py", source)
    named: list[str] = []
    real = closure._named_by

    def counted(relpath: str, *args: object) -> list[str]:
        named.append(relpath)
        return real(relpath, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(closure, "_named_by", counted)
    # vllm/two.py now also reads vllm/four.py; vllm/new/ is a new folder.
    later = {
        **files,
        "vllm/two.py": b"from vllm.three import y\nfrom vllm.four import z\nx = 1\n",
        "vllm/new/five.py": b"",
    }
    inherited = closure.ModuleIndex(later).digest("vllm/one.py", source)
    assert named == ["vllm/two.py", "vllm/four.py"]
    monkeypatch.setattr(closure, "_LAST", [])
    assert closure.ModuleIndex(later).digest("vllm/one.py", source) == inherited
    assert "vllm.four" in closure.ModuleIndex(later).closure("vllm/one.py", source)


def _walked(files: dict[str, bytes], path: str) -> set[str]:
    """What ty can reach from ``path``, walked from nothing each time: the
    answer the components' shared work must give."""
    index = closure.ModuleIndex(files)
    todo = list(closure._modules_of(import_lists._scanned(files[path]), path))
    parts = path.split("/")[:-1]
    todo += [".".join(parts[:n]) + "/" for n in range(1, len(parts) + 1)]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += [] if module.endswith("/") else index._next(module)
    return seen


def test_a_cycle_of_imports_is_worked_out_once_and_never_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's modules are mostly one cycle: what a component of the import
    graph reaches is worked out once and shared by every file that joins
    it, and each answer is the walk's from nothing, in the state it was
    asked in, also after an edit inside the cycle."""
    files = {
        "vllm/__init__.py": b"",
        "vllm/config.py": b"from vllm.logger import log\nfrom vllm import envs\n",
        "vllm/logger.py": b"from vllm.envs import LEVEL\nlog = 1\n",
        "vllm/envs.py": b"from vllm.config import Config\nLEVEL = 1\n",
        "vllm/a/__init__.py": b"",
        "vllm/a/one.py": b"from vllm.config import Config\n",
        "vllm/a/two.py": b"import vllm.logger\nfrom vllm.a.leaf import x\n",
        "vllm/a/leaf.py": b"x = 1\n",
        "vllm/spare.py": b"from vllm.a.leaf import x\n",
    }
    monkeypatch.setattr(closure, "_LAST", [])
    index = closure.ModuleIndex(files)
    for path in ("vllm/a/one.py", "vllm/a/two.py", "vllm/spare.py", "vllm/envs.py"):
        assert set(index.closure(path, [files[path]])) == _walked(files, path), path
    # The cycle is one component: one answer, held for each of its modules.
    cycle = {"vllm.config", "vllm.logger", "vllm.envs"}
    assert len({index._reach[m] for m in cycle}) == 1
    # Two files of one folder that join the same components share one
    # closure, and its digest.
    assert index.closure("vllm/a/one.py", [files["vllm/a/one.py"]]) is (
        index.closure("vllm/a/leaf.py", [files["vllm/a/one.py"]])
    )
    # A fix that rewrites code, not imports, keeps what each module reaches
    # (the same answer), and each closure, with the changed module's state.
    body = {**files, "vllm/logger.py": b"from vllm.envs import LEVEL\nlog = 2\n"}
    kept = closure.ModuleIndex(body)
    assert kept._reach["vllm.config"] is index._reach["vllm.config"]
    found = kept.closure("vllm/a/one.py", [body["vllm/a/one.py"]])
    assert set(found) == _walked(body, "vllm/a/one.py")
    assert found["vllm.logger"] != index._modules["vllm.logger"]
    assert closure.digest_of(found) == closure.digest_of(dict(found))
    # An edit of the cycle's imports: the next state's answers are the walk's.
    later = {**files, "vllm/logger.py": b"from vllm.spare import x\nlog = 1\n"}
    again = closure.ModuleIndex(later)
    for path in ("vllm/a/one.py", "vllm/a/two.py", "vllm/spare.py"):
        found = again.closure(path, [later[path]])
        assert set(found) == _walked(later, path), path
    assert "vllm.spare" in again.closure("vllm/a/one.py", [later["vllm/a/one.py"]])
    assert "vllm.spare" not in index.closure("vllm/a/one.py", [files["vllm/a/one.py"]])

    # An import added of a module the cycle reached already (vllm.config,
    # of the cycle itself): what each module reaches stays, the same
    # answer, as the walk's.
    monkeypatch.setattr(closure, "_LAST", [index])
    added = {
        **files,
        "vllm/logger.py": b"from vllm.envs import LEVEL\nimport vllm.config\nlog = 1\n",
    }
    grown = closure.ModuleIndex(added)
    assert grown._reach["vllm.config"] is index._reach["vllm.config"]
    for path in ("vllm/a/one.py", "vllm/a/two.py", "vllm/spare.py"):
        assert set(grown.closure(path, [added[path]])) == _walked(added, path), path
    # An import dropped breaks the cycle: vllm/logger.py reaches no more.
    dropped = {**files, "vllm/logger.py": b"log = 1\n"}
    broken = closure.ModuleIndex(dropped)
    for path in ("vllm/a/one.py", "vllm/a/two.py", "vllm/envs.py"):
        found = broken.closure(path, [dropped[path]])
        assert set(found) == _walked(dropped, path), path
    assert "vllm.envs" not in broken.closure("vllm/logger.py", [b"log = 1\n"])


def test_a_closure_carried_through_states_never_asked_is_the_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An index takes the closures of the one before it whose components
    still stand, made again only where asked for, with the state of every
    module changed since: also across states in which nobody asked."""
    files = CHAIN
    source = [files["vllm/one.py"]]
    monkeypatch.setattr(closure, "_LAST", [])
    first = closure.ModuleIndex(files).closure("vllm/one.py", source)
    # Two fixes, one state each; the closure is asked for only after both.
    middle = {**files, "vllm/three.py": b"y = 2\n"}
    closure.ModuleIndex(middle)
    last = {**middle, "vllm/two.py": b"from vllm.three import y\nx = 3\n"}
    carried = closure.ModuleIndex(last).closure("vllm/one.py", source)
    monkeypatch.setattr(closure, "_LAST", [])
    fresh = closure.ModuleIndex(last).closure("vllm/one.py", source)
    assert dict(carried) == dict(fresh) != dict(first)
    assert closure.digest_of(carried) == closure.digest_of(fresh)
    assert carried["vllm.three"] != first["vllm.three"]  # changed in the middle


def _fresh_lists(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """A process that has scanned nothing, with an empty cache folder."""
    from deepstack_patch.engine import forked

    monkeypatch.setenv("DEEPSTACK_PATCH_CACHE", str(cache))
    monkeypatch.delenv("DEEPSTACK_PATCH_NO_CACHE", raising=False)
    # Another test may leave a thread behind; the scan takes no lock.
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    for name, empty in (
        ("_KNOWN", {}),
        ("_NEW", {}),
        ("_BY_CONTENT", {}),
        ("_LOADED", []),
        ("_AHEAD", []),
    ):
        monkeypatch.setattr(import_lists, name, empty)
    monkeypatch.setattr(closure, "_LAST", [])


def test_the_imports_a_child_scanned_ahead_are_the_first_closure_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a plan starts, a forked child scans the imports of the package's
    files; the first closure takes its lists (scanning here only a file
    whose bytes it did not see), the answer is the walk's, and the child is
    reaped. Where nobody takes its answer it is stopped; where the lists
    are kept from an earlier run none is started."""
    import os

    root = tmp_path / "tree"
    for relpath, raw in CHAIN.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(raw)
    _fresh_lists(monkeypatch, tmp_path / "cache")
    later = {**CHAIN, "vllm/three.py": b"y = 2\n"}  # an earlier fix's rewrite
    with import_lists.scanning_ahead(root):
        (child,) = import_lists._AHEAD
        index = closure.ModuleIndex(later)
        found = index.closure("vllm/one.py", [later["vllm/one.py"]])
        assert import_lists._AHEAD == []
    assert index.scanned == 1  # vllm/three.py as rewritten: the child saw 2
    assert set(found) == _walked(later, "vllm/one.py")
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, 0)  # reaped
    # Nobody asks: the child is stopped and reaped all the same.
    _fresh_lists(monkeypatch, tmp_path / "cache")
    with import_lists.scanning_ahead(root):
        (child,) = import_lists._AHEAD
    assert import_lists._AHEAD == []
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, 0)
    # The lists kept by an earlier run: nothing to scan ahead.
    _fresh_lists(monkeypatch, tmp_path / "cache")
    closure.ModuleIndex(later).closure("vllm/one.py", [later["vllm/one.py"]])
    import_lists.save()
    _fresh_lists(monkeypatch, tmp_path / "cache")
    with import_lists.scanning_ahead(root):
        assert import_lists._AHEAD == []

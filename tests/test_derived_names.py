"""Issue 30, items 1-3: a derived patch writes only code whose names resolve,
adds only the imports its fix adds, and is ``applied`` only where every
unit of its code is.

The fast tier builds small synthetic trees; the release tier runs a small
diff of the vllm#48429 kind (a name imported from ``qwen3_next`` that the
release lacks), made here from the release's own files, on 0.20.2.
"""

from __future__ import annotations

import ast
import difflib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from deepstack_patch.authoring.derive import derive_patch_from_text
from deepstack_patch.engine.apply import apply_tree
from deepstack_patch.engine.derived import DerivedPatch, load_derived
from deepstack_patch.engine.derived.data import write_derived
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.plan import plan_tree, rewrite_text
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.tree import ASKED_FOR, VllmTree

from tests.support.toys import derived_patch, toy_tree

PATH = "vllm/models/b.py"
OTHER = "vllm/models/a.py"


def patch_of(*changes: tuple[str, str, str]) -> DerivedPatch:
    return derived_patch("local#30", *changes)


def states(patch: DerivedPatch, source: str, path: str = PATH) -> dict[str, tuple]:
    return {
        f.symbol: (f.state, f.reason) for f in patch.recognise(ast.parse(source), path)
    }


def make_tree(root: Path, files: dict[str, str], *, whole: bool = True) -> VllmTree:
    """A vLLM tree; ``whole``: with its pyproject.toml, as a checkout or an
    sdist has it; else this tool's partial extraction, with its list of
    what it was asked for (empty unless ``files`` gives one)."""
    return toy_tree(root, {"vllm/models/__init__.py": "", **files}, whole=whole)


def report_of(tree: VllmTree, patch: DerivedPatch):
    return plan_tree(tree, [patch], rewrite=False).report(patch.id)


# -- item 1: names in the file ------------------------------------------------

FILE_BEFORE = """import os

LIMIT = 4


def size(n, items):
    total = n
    return total
"""

FILE_AFTER = """import os

LIMIT = 4


def size(n, items):
    total = n
    total += len([x for x in items if x]) + (lambda y: y)(LIMIT) + SCALE
    return total
"""


def test_a_global_the_target_lacks_drifts_and_is_named() -> None:
    patch = patch_of((PATH, FILE_BEFORE, FILE_AFTER))
    # The fix's file had SCALE; a target without it cannot run the fix.
    with_scale = FILE_BEFORE.replace("LIMIT = 4\n", "LIMIT = 4\nSCALE = 2\n")
    assert states(patch, with_scale)["size"] == (PatchState.NEEDED, "")
    assert states(patch, FILE_BEFORE)["size"] == (
        PatchState.DRIFTED,
        f"the fix reads `SCALE`, which {PATH} does not define or import",
    )
    assert rewrite_text(patch, FILE_BEFORE, PATH) == FILE_BEFORE
    # An import of it, anywhere at the top level, or a * import is enough.
    for target in (
        FILE_BEFORE.replace("import os\n", "import os\nfrom m import SCALE\n"),
        FILE_BEFORE + "\ntry:\n    SCALE = 1\nexcept ImportError:\n    pass\n",
        FILE_BEFORE.replace("import os\n", "import os\nfrom m import *\n"),
    ):
        assert states(patch, target)["size"][0] is PatchState.NEEDED, target


def test_a_name_the_patch_adds_itself_resolves() -> None:
    before = "def f(x):\n    return x\n"
    after = (
        "LIMIT = 3\n\n\ndef g(x):\n    return x\n\n\n"
        "def f(x):\n    return g(x) + LIMIT\n"
    )
    patch = patch_of((PATH, before, after))
    assert {s for s, _ in states(patch, before).values()} == {PatchState.NEEDED}
    fixed = rewrite_text(patch, before, PATH)
    assert ast.dump(ast.parse(fixed)) == ast.dump(ast.parse(after))


def test_a_name_the_patch_adds_in_a_top_level_block_resolves() -> None:
    before = "if True:\n    pass\n\n\ndef f(x):\n    return x\n"
    after = "if True:\n    from m import g\n\n\ndef f(x):\n    return g(x)\n"
    patch = patch_of((PATH, before, after))
    assert {s for s, _ in states(patch, before).values()} == {PatchState.NEEDED}


def test_a_local_the_target_function_lacks_drifts() -> None:
    before = "def f(x):\n    y = x\n    z = 1\n    return y\n"
    after = "def f(x):\n    y = x\n    z = 1\n    return y + z\n"
    patch = patch_of((PATH, before, after))
    assert states(patch, before)["f"] == (PatchState.NEEDED, "")
    # `z` is a local of the fix's function; the target's has none.
    state, reason = states(patch, "def f(x):\n    y = x\n    return y\n")["f"]
    assert state is PatchState.DRIFTED
    assert reason == f"the fix reads `z`, which {PATH} does not define or import"


# -- item 1: names of other modules of the tree ---------------------------------

USER_BEFORE = """from vllm.models.a import Layer


def run(x):
    return Layer(x)
"""

USER_AFTER = """from vllm.models.a import Layer, gather


def run(x):
    x = gather(x)
    return Layer(x)
"""


def test_a_name_imported_from_a_module_that_lacks_it_drifts(tmp_path: Path) -> None:
    patch = patch_of((PATH, USER_BEFORE, USER_AFTER))
    lacking = make_tree(
        tmp_path / "old", {OTHER: "class Layer:\n    pass\n", PATH: USER_BEFORE}
    )
    report = report_of(lacking, patch)
    assert report.state is PatchState.DRIFTED
    assert (
        "the fix needs `gather` from `vllm.models.a`, which this release lacks"
        in report.reason
    )
    result = apply_tree(lacking, [patch], {patch.id})
    assert not result.written
    assert (lacking.root / PATH).read_text() == USER_BEFORE
    having = make_tree(
        tmp_path / "new",
        {
            OTHER: "class Layer:\n    pass\n\n\ndef gather(x):\n    return x\n",
            PATH: USER_BEFORE,
        },
    )
    assert report_of(having, patch).state is PatchState.NEEDED
    assert apply_tree(having, [patch], {patch.id}).written == [PATH]
    assert (having.root / PATH).read_text() == USER_AFTER


@pytest.mark.parametrize(
    "module_text",
    [
        "from .c import gather\nclass Layer:\n    pass\n",  # imported there
        "class Layer:\n    pass\n\n\ndef __getattr__(name):\n    return name\n",
        "from .c import *\nclass Layer:\n    pass\n",  # c defines it
    ],
)
def test_a_name_the_module_has_another_way_resolves(
    tmp_path: Path, module_text: str
) -> None:
    patch = patch_of((PATH, USER_BEFORE, USER_AFTER))
    tree = make_tree(
        tmp_path,
        {
            OTHER: module_text,
            "vllm/models/c.py": "def gather(x):\n    return x\n",
            PATH: USER_BEFORE,
        },
    )
    assert report_of(tree, patch).state is PatchState.NEEDED


def test_a_name_only_listed_in_all_drifts_in_the_type_checkers_words(
    tmp_path: Path,
) -> None:
    """Issue 34 item 1 inverts a case of issue 30's: a name a module lists
    in ``__all__`` and does not define is not there (``from a import
    gather`` raises ImportError); ty says so on the fixed file."""
    patch = patch_of((PATH, USER_BEFORE, USER_AFTER))
    tree = make_tree(
        tmp_path,
        {OTHER: "class Layer:\n    pass\n\n\n__all__ = ['Layer', 'gather']\n"}
        | {PATH: USER_BEFORE},
    )
    report = report_of(tree, patch)
    assert report.state is PatchState.DRIFTED
    assert (
        "the fix needs `gather` from `vllm.models.a`, which this release lacks "
        "(ty: Module `vllm.models.a` has no member `gather` [missing-module-member])"
        in report.reason
    )


def test_a_relative_import_and_a_missing_module(tmp_path: Path) -> None:
    before = USER_BEFORE.replace("vllm.models.a", ".a")
    after = USER_AFTER.replace("vllm.models.a", ".a")
    patch = patch_of((PATH, before, after))
    tree = make_tree(
        tmp_path / "rel", {OTHER: "class Layer:\n    pass\n", PATH: before}
    )
    assert "`gather` from `vllm.models.a`" in report_of(tree, patch).reason
    # A whole tree without the module lacks it; a partial extraction (no
    # pyproject.toml, most modules left in the archive) cannot tell.
    moved = make_tree(tmp_path / "whole", {PATH: before})
    assert report_of(moved, patch).state is PatchState.DRIFTED
    partial = make_tree(tmp_path / "partial", {PATH: before}, whole=False)
    assert report_of(partial, patch).state is PatchState.NEEDED


def test_a_partial_tree_lacks_the_modules_it_was_asked_for(tmp_path: Path) -> None:
    """A partial extraction lists what it was asked for (status --release,
    matrix, derive --base): the fix's modules, which the patch names."""
    patch = patch_of((PATH, USER_BEFORE, USER_AFTER))
    assert {
        "vllm/__init__.py",
        "vllm/models/__init__.py",
        "vllm/models/a.py",
        "vllm/models/a/__init__.py",
        "vllm/models/a/gather.py",  # ``from vllm.models.a import gather``: a
    } <= set(patch.also_reads)  # submodule, perhaps
    listed = "\n".join([PATH, *patch.also_reads])
    for name, text in (("lacking", "class Layer:\n    pass\n"), ("absent", None)):
        files = {PATH: USER_BEFORE, ASKED_FOR: listed}
        tree = make_tree(
            tmp_path / name, {**files, **({OTHER: text} if text else {})}, whole=False
        )
        report = report_of(tree, patch)
        assert report.state is PatchState.DRIFTED, name
        assert "`gather` from `vllm.models.a`, which this release lacks" in (
            report.reason
        )
    # Asked for by a glob, as a patch's paths are.
    globbed = make_tree(
        tmp_path / "globbed",
        {PATH: USER_BEFORE, ASKED_FOR: "vllm/models/*.py\nvllm/models/**/*.py\n"},
        whole=False,
    )
    assert report_of(globbed, patch).state is PatchState.DRIFTED
    # Not asked for: a partial extraction cannot tell.
    unasked = make_tree(
        tmp_path / "unasked", {PATH: USER_BEFORE, ASKED_FOR: PATH}, whole=False
    )
    assert report_of(unasked, patch).state is PatchState.NEEDED


def test_a_data_file_whose_code_does_not_parse_is_refused_not_raised(
    tmp_path: Path,
) -> None:
    """The modules a fix reads are read off its code only once load has
    checked that it parses."""
    patch = patch_of((PATH, USER_BEFORE, USER_AFTER))
    written = write_derived(patch, tmp_path)
    text = written.read_text()
    assert text.count("x = gather(x)") >= 1
    written.write_text(text.replace("x = gather(x)", "x = gather(x"))
    with pytest.raises(DeepstackError, match="recorded code does not parse"):
        load_derived(written)


def test_a_package_a_partial_tree_has_only_some_files_of_is_unknown(
    tmp_path: Path,
) -> None:
    """A folder of a partial extraction without its ``__init__.py`` is no
    namespace package: the ``__init__.py`` was not extracted."""
    before = "from vllm.pkg import Layer\n\n\ndef run(x):\n    return Layer(x)\n"
    after = (
        "from vllm.pkg import Layer, gather\n\n\ndef run(x):\n    return gather(x)\n"
    )
    patch = patch_of((PATH, before, after))
    files = {"vllm/pkg/other.py": "", PATH: before}
    partial = make_tree(tmp_path / "partial", files, whole=False)
    assert report_of(partial, patch).state is PatchState.NEEDED
    whole = make_tree(tmp_path / "whole", files)  # a namespace package there
    assert "`gather` from `vllm.pkg`" in report_of(whole, patch).reason


def test_a_name_the_patch_adds_to_the_other_module_resolves(tmp_path: Path) -> None:
    other_before = "class Layer:\n    pass\n"
    other_after = other_before + "\n\ndef gather(x):\n    return x\n"
    base = make_tree(tmp_path, {OTHER: other_before, PATH: USER_BEFORE})
    diff = _diff(OTHER, other_before, other_after) + _diff(
        PATH, USER_BEFORE, USER_AFTER
    )
    result = derive_patch_from_text(diff, base, "local#31")  # the self-check passes
    assert report_of(base, result.patch).state is PatchState.NEEDED


def test_an_attribute_of_an_imported_vllm_module(tmp_path: Path) -> None:
    before = "import vllm.models.a as a_mod\n\n\ndef run(x):\n    return x\n"
    after = (
        "import vllm.models.a as a_mod\n\n\ndef run(x):\n    return a_mod.gather(x)\n"
    )
    patch = patch_of((PATH, before, after))
    lacking = make_tree(tmp_path / "old", {OTHER: "X = 1\n", PATH: before})
    assert (
        "the fix needs `gather` from `vllm.models.a`, which this release lacks"
        in report_of(lacking, patch).reason
    )
    having = make_tree(
        tmp_path / "new", {OTHER: "def gather(x):\n    return x\n", PATH: before}
    )
    assert report_of(having, patch).state is PatchState.NEEDED
    # An attribute of a module outside vllm is not judged; one of a local is
    # there where the release defines or reads its name (issue 34 item 1).
    after = before.replace("return x\n", "return x.gather(torch.nothing)\n")
    patch = patch_of(
        (
            PATH,
            before.replace("import", "import torch\nimport", 1),
            after.replace("import", "import torch\nimport", 1),
        )
    )
    user = before.replace("import", "import torch\nimport", 1)
    target = make_tree(tmp_path / "obj", {OTHER: "X = 1\n", PATH: user})
    assert report_of(target, patch).reason == (
        "the fix reads `x.gather`, which nothing in this release defines or "
        "reads (no `gather` in its vllm package)"
    )
    target = make_tree(
        tmp_path / "obj-defined",
        {OTHER: "class G:\n    def gather(self):\n        pass\n", PATH: user},
    )
    assert report_of(target, patch).state is PatchState.NEEDED


# -- item 2: imports, only what the fix adds ------------------------------------

IMPORT_BEFORE = """from m import a, b


def f():
    return a() + b()
"""

IMPORT_AFTER = """from m import a, b, c


def f():
    return a() + b() + c()
"""


def test_a_name_on_a_context_line_is_never_added() -> None:
    patch = patch_of((PATH, IMPORT_BEFORE, IMPORT_AFTER))
    target = IMPORT_BEFORE.replace("from m import a, b\n", "from m import a\nb = a\n")
    fixed = rewrite_text(patch, target, PATH)
    assert fixed.startswith("from m import a, c\nb = a\n"), fixed
    assert "return a() + b() + c()" in fixed
    assert {s for s, _ in states(patch, fixed).values()} == {PatchState.APPLIED}


def test_a_context_name_the_new_code_reads_is_not_added_and_drifts() -> None:
    before = "from m import a, b\n\n\ndef f():\n    return a()\n"
    after = "from m import a, b, c\n\n\ndef f():\n    return a() + b() + c()\n"
    patch = patch_of((PATH, before, after))
    target = before.replace("from m import a, b\n", "from m import a\n")
    state, reason = states(patch, target)["f"]
    assert state is PatchState.DRIFTED
    assert reason == f"the fix reads `b`, which {PATH} does not define or import"


# -- item 3: applied means every code unit is applied ----------------------------

CLASS_BEFORE = """import torch


class Model:
    def forward(self, x):
        return x
"""

CLASS_AFTER = """import torch
from m import scale


class Model:
    def forward(self, x):
        return scale(x)
"""


def test_code_all_absent_is_not_applicable_imports_and_all(tmp_path: Path) -> None:
    patch = patch_of((PATH, CLASS_BEFORE, CLASS_AFTER))
    gone = "import torch\nfrom m import scale\n\n\nclass Other:\n    pass\n"
    assert patch.recognise(ast.parse(gone), PATH) == []
    assert patch.recognise(ast.parse("import torch\n"), PATH) == []
    tree = make_tree(tmp_path, {PATH: "import torch\n\n\nclass Other:\n    pass\n"})
    assert report_of(tree, patch).state is PatchState.NOT_APPLICABLE
    result = apply_tree(tree, [patch], {patch.id})
    assert result.plan.edits == [] and not result.written
    assert (
        tree.root / PATH
    ).read_text() == "import torch\n\n\nclass Other:\n    pass\n"


def test_imports_alone_never_make_a_patch_needed() -> None:
    patch = patch_of((PATH, CLASS_BEFORE, CLASS_AFTER))
    # The fix's code is in, imported another way: nothing to do.
    fixed = CLASS_AFTER.replace("from m import scale\n", "from m import *\n")
    assert {s for s, _ in states(patch, fixed).values()} == {PatchState.APPLIED}
    assert rewrite_text(patch, fixed, PATH) == fixed


def test_an_imports_only_file_follows_the_code_of_the_others(tmp_path: Path) -> None:
    init = "vllm/models/__init__.py"
    patch = patch_of(
        (PATH, CLASS_BEFORE, CLASS_AFTER.replace("from m", "from vllm.models.m")),
        (
            init,
            "from .b import Model\n",
            "from .b import Model\nfrom .m import scale\n",
        ),
    )
    files = {
        "vllm/models/m.py": "def scale(x):\n    return x\n",
        init: "from .b import Model\n",
    }
    absent = make_tree(tmp_path / "absent", {**files, PATH: "class Other:\n    pass\n"})
    report = report_of(absent, patch)
    assert report.state is PatchState.NOT_APPLICABLE, report.reason
    assert not apply_tree(absent, [patch], {patch.id}).written
    needed = make_tree(tmp_path / "needed", {**files, PATH: CLASS_BEFORE})
    assert report_of(needed, patch).state is PatchState.NEEDED
    # The __init__'s import is checked too: m lacks scale.
    lacking = make_tree(
        tmp_path / "lacking",
        {**files, "vllm/models/m.py": "X = 1\n", PATH: CLASS_BEFORE},
    )
    state, reason = report_of(lacking, patch).part_state(f"{init}::imports")
    assert state is PatchState.DRIFTED
    assert "the fix needs `scale` from `vllm.models.m`" in reason
    missing = make_tree(tmp_path / "missing", files)  # no vllm/models/b.py
    assert report_of(missing, patch).state is PatchState.NOT_APPLICABLE
    done = CLASS_AFTER.replace("from m import scale", "from vllm.models.m import *")
    applied = make_tree(tmp_path / "applied", {**files, PATH: done})
    assert report_of(applied, patch).state is PatchState.APPLIED


# -- the release tier: a diff of the vllm#48429 kind on 0.20.2 --------------------

MTP = "vllm/model_executor/models/qwen3_next_mtp.py"
NEXT = "vllm/model_executor/models/qwen3_next.py"
HELPER = "_all_gather_hidden_and_residual"
NEXT_MODULE = "vllm.model_executor.models.qwen3_next"


#: Where qwen3_next_mtp imports from, outside the files the built-in series
#: reads (a partial extraction held only those before): a module 0.20.2 has,
#: and one it has not.
PARALLEL_STATE = "vllm.distributed.parallel_state"
NEW_MODULE = "vllm.distributed.gather_helpers"


def fixed_mtp(mtp: str, module: str) -> str:
    """0.20.2's qwen3_next_mtp with the fix: ``HELPER``, imported from
    ``module``, called before the final norm."""
    if module == NEXT_MODULE:  # into the import list the file has
        imported = mtp.replace(
            "    QwenNextMixtureOfExperts,\n)\n",
            f"    QwenNextMixtureOfExperts,\n    {HELPER},\n)\n",
            1,
        )
    else:  # a line of its own, or into that of parallel_state
        line = "from vllm.distributed.parallel_state import get_pp_group\n"
        added = (
            f"from {module} import {HELPER}, get_pp_group\n"
            if module == PARALLEL_STATE
            else f"{line}from {module} import {HELPER}\n"
        )
        imported = mtp.replace(line, added, 1)
    fixed = imported.replace(
        "        hidden_states, _ = self.norm(hidden_states, residual)\n",
        f"        hidden_states, residual = {HELPER}(hidden_states, residual)\n"
        "        hidden_states, _ = self.norm(hidden_states, residual)\n",
        1,
    )
    assert fixed.count(HELPER) == 2
    return fixed


def derived_48429(
    release: Path, tmp_path: Path, module: str = "", patch_id: str = "local#48429"
) -> DerivedPatch:
    """A fix of the vllm#48429 kind, derived on a stand-in parent of
    ``release``: qwen3_next_mtp imports and calls a helper of ``module``
    (qwen3_next by default) that the release lacks."""
    module = module or NEXT_MODULE
    module_file = module.replace(".", "/") + ".py"
    mtp = (release / MTP).read_text()
    # The fix's parent: 0.20.2's files, with the helper upstream added to
    # the module before the fix (a stand-in, written here).
    parent = make_tree(tmp_path / f"parent-{module}", {MTP: mtp, module_file: ""})
    if (release / module_file).is_file():
        assert HELPER not in (release / module_file).read_text()  # the case
        shutil.copy(release / module_file, parent.root / module_file)
    with (parent.root / module_file).open("a") as out:
        out.write(f"\n\ndef {HELPER}(hidden_states, residual):\n")
        out.write("    return hidden_states, residual\n")
    diff = _diff(MTP, mtp, fixed_mtp(mtp, module))
    return derive_patch_from_text(diff, parent, patch_id).patch


@pytest.mark.release
def test_a_name_the_release_lacks_drifts_on_a_real_release(
    tmp_path: Path,
    release_tree: Callable[[str], Path],
    patched_copy: Callable[[str], Path],
) -> None:
    release = release_tree("0.20.2")
    mtp = (release / MTP).read_text()
    patch = derived_48429(release, tmp_path)
    report = report_of(VllmTree.open(release), patch)
    assert report.state is PatchState.DRIFTED
    assert (
        f"the fix needs `{HELPER}` from `vllm.model_executor.models.qwen3_next`, "
        "which this release lacks" in report.reason
    )
    copy = patched_copy("0.20.2")
    result = apply_tree(VllmTree.open(copy), [patch], {patch.id})
    assert not result.written
    assert (copy / MTP).read_text() == mtp


@pytest.mark.release
@pytest.mark.parametrize("module", [PARALLEL_STATE, NEW_MODULE])
def test_a_name_the_release_lacks_drifts_in_a_partial_extraction(
    module: str, tmp_path: Path, release_tree: Callable[[str], Path]
) -> None:
    """``status --release`` (no --out) and ``matrix`` read a partial
    extraction of the release: it holds the modules the fix imports from
    (parallel_state, which lacks the name; the built-in series reads no
    file of vllm/distributed) and knows it was asked for a module the
    release has not (gather_helpers), so the fix is found lacking there."""
    folder = tmp_path / "patches"
    folder.mkdir()
    write_derived(derived_48429(release_tree("0.20.2"), tmp_path, module), folder)
    work = tmp_path / "work"  # no ./vllm-0.20.2 here: the cache's partial tree
    work.mkdir()
    (work / "releases.txt").write_text("0.20.2\n")
    reason = f"the fix needs `{HELPER}` from `{module}`, which this release lacks"
    for command in (
        ["status", "--release", "0.20.2", "--only", "local#48429"],
        ["matrix", "--releases", "releases.txt", "--only", "local#48429"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "deepstack_patch", *command]
            + ["--patches", str(folder), "--format", "json"],
            capture_output=True,
            text=True,
            cwd=work,
            timeout=600,
        )
        # status: 2, a patch drifted; matrix: 0, no expectation for local#48429
        assert result.returncode == {"status": 2, "matrix": 0}[command[0]], result
        document = json.loads(result.stdout)
        if command[0] == "status":
            (found,) = [p for p in document["patches"] if p["id"] == "local#48429"]
            assert found["state"] == "drifted", found
            assert reason in json.dumps(found), found
        else:
            (release,) = document["releases"]
            assert release["states"]["local#48429"] == "drifted", release
            assert reason in release["reasons"]["local#48429"], release


@pytest.mark.release
def test_derive_on_a_release_refuses_a_fix_whose_name_it_lacks(
    tmp_path: Path, release_tree: Callable[[str], Path]
) -> None:
    """``derive --base 0.20.2`` reads a partial extraction too: the fix is
    checked where the module it imports from is, and refused on a base that
    lacks the name (before, the data file was written)."""
    mtp = (release_tree("0.20.2") / MTP).read_text()
    diff = tmp_path / "fix.diff"
    diff.write_text(_diff(MTP, mtp, fixed_mtp(mtp, PARALLEL_STATE)))
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", "derive", "--diff", str(diff)]
        + ["--base", "0.20.2", "--id", "local#48429", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 2, result
    assert (
        f"the fix needs `{HELPER}` from `{PARALLEL_STATE}`, which this release lacks"
        in result.stderr
    ), result.stderr
    assert not list(out.glob("*.toml"))


def _diff(path: str, before: str, after: str) -> str:
    return f"diff --git a/{path} b/{path}\n" + "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
        )
    )


def test_some_code_there_and_some_absent_drifts_in_every_order(
    tmp_path: Path,
) -> None:
    f = ("def f():\n    return 1\n", "def f():\n    return 2\n")
    g = ("def g():\n    return 1\n", "def g():\n    return 2\n")
    for first, second in ((f, g), (g, f)):
        patch = patch_of((PATH, first[0], first[1]), (OTHER, second[0], second[1]))
        for state_of_first in first:  # needed, then applied
            tree = make_tree(
                tmp_path / str(len(list(tmp_path.iterdir()))),
                {PATH: state_of_first, OTHER: "x = 1\n"},
            )
            report = report_of(tree, patch)
            assert report.state is PatchState.DRIFTED, (first, state_of_first)
            assert "applies whole or not at all" in report.reason
            assert not apply_tree(tree, [patch], {patch.id}).written

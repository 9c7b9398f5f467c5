"""derive's self-check on the commit's own parent (issue 40, item 3): the
shapes of upstream fixes that failed it, as small synthetic modules.

The fix is right on its parent by construction, so a failure there is the
tool's: each test here is one such class, derived and checked exactly as
``derive --commit`` checks it.
"""

from __future__ import annotations

from pathlib import Path

from deepstack_patch.authoring.derive import derive_patch_from_text
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.protocol import PatchState
from deepstack_patch.engine.tree import VllmTree

from tests.test_derive import _tree, git_diff


def derived_text(tmp_path: Path, path: str, before: str, after: str) -> str:
    """How derive's round trip compared (it raises where the check fails)."""
    tree = _tree(tmp_path / "base", {path: before})
    return derive_patch_from_text(
        git_diff(path, before, after), tree, "local#P"
    ).round_trip


def test_statements_added_at_a_methods_end_after_its_blank_line(
    tmp_path: Path,
) -> None:
    """vllm#35219: the new ``if`` ends ``initialize_from_config``, and a line
    diff writes it after the blank line that ends the method, where the next
    method's decorator begins: still inside the method's lines."""
    before = (
        "class Worker:\n"
        "    def init(self, config):\n"
        "        if config.sleep:\n"
        "            self.a = 1\n"
        "        else:\n"
        "            self.b = 2\n"
        "\n"
        "    @staticmethod\n"
        "    def other():\n"
        "        return 0\n"
        "\n"
        "    def zero(self):\n"  # what the fix calls is there (ty reads it)
        "        pass\n"
    )
    after = before.replace(
        "            self.b = 2\n\n",
        "            self.b = 2\n\n"
        "        # zero the blocks\n"
        "        if config.zero:\n"
        "            self.zero()\n\n",
    )
    assert derived_text(tmp_path, "vllm/w.py", before, after) == "text"


ONE_LINE_CLASSES = """from vllm.deco import compiled, registered


@registered(info=1)
@compiled(enable=True)
class Model(Base): ...


@compiled(enable=True)
class Other(
    Base, Mixin
): ...
"""


def test_a_decorator_dropped_from_a_class_whose_block_is_on_its_line(
    tmp_path: Path,
) -> None:
    """vllm#30518: ``class A(B): ...`` loses a decorator. The header's last
    line holds the class's one-line block, so that line is the header's."""
    after = (
        ONE_LINE_CLASSES.replace("compiled, registered", "registered")
        .replace("@compiled(enable=True)\nclass Model", "class Model")
        .replace("@compiled(enable=True)\nclass Other", "class Other")
    )
    files = {"vllm/deco.py": "def compiled(**k): ...\ndef registered(**k): ...\n"}
    tree = _tree(tmp_path / "base", {"vllm/w.py": ONE_LINE_CLASSES, **files})
    result = derive_patch_from_text(
        git_diff("vllm/w.py", ONE_LINE_CLASSES, after), tree, "local#P"
    )
    assert result.round_trip == "text"
    # A vendor's block on that line is kept as the vendor wrote it...
    vendor = ONE_LINE_CLASSES.replace("(Base): ...", "(Base): pass")
    root = _tree(tmp_path / "vendor", {"vllm/w.py": vendor, **files}).root
    plan = plan_tree(VllmTree.open(root), [result.patch])
    (edit,) = plan.edits
    assert "class Model(Base): pass\n" in edit.new.decode()
    assert "@compiled" not in edit.new.decode()
    # ... and where the lines the fix changes are not the recorded ones, the
    # header is not written whole over the vendor's block: refused.
    vendor = vendor.replace(
        "@compiled(enable=True)\nclass Model",
        "@compiled(enable=True)  # ours\nclass Model",
    )
    (root / "vllm/w.py").write_text(vendor)
    plan = plan_tree(VllmTree.open(root), [result.patch])
    report = plan.report("local#P")
    assert report.state is PatchState.DRIFTED and not plan.edits
    assert "the header shares its last line with its block" in report.reason


def test_a_new_first_import_goes_before_the_one_it_precedes_upstream(
    tmp_path: Path,
) -> None:
    """vllm#30518's ``import sys``: upstream's first import, which has no
    import before it, is written before the import that follows it
    upstream, not after the file's last import."""
    before = (
        '"""A module."""\n\nfrom collections.abc import Callable\n'
        "from itertools import chain\n\n\ndef f():\n    return chain\n"
    )
    after = before.replace(
        "\n\nfrom collections", "\n\nimport sys\nfrom collections"
    ).replace("return chain", "return chain, sys.argv")
    assert derived_text(tmp_path, "vllm/m.py", before, after) == "text"


def test_an_import_moved_to_another_module_is_dropped_where_it_was(
    tmp_path: Path,
) -> None:
    """vllm#30566 moves ``MultiModalDataDict`` to ``vllm.inputs``: the name
    is still used, and it is dropped from its old import because the fix
    imports it from the new place (one move, not half of it applied)."""
    before = (
        "from vllm.old import (\n    DataDict,\n    Other,\n)\n\n\n"
        "def f(x: DataDict) -> Other:\n    return x\n"
    )
    after = before.replace(
        "from vllm.old import (\n    DataDict,\n",
        "from vllm.new import DataDict\nfrom vllm.old import (\n",
    )
    modules = {
        "vllm/new.py": "DataDict = dict\n",
        "vllm/old.py": "DataDict = Other = dict\n",
    }
    tree = _tree(tmp_path / "base", {"vllm/m.py": before, **modules})
    result = derive_patch_from_text(git_diff("vllm/m.py", before, after), tree, "x#1")
    assert result.round_trip == "text"
    # Moved already (a release with the fix): applied, nothing to write.
    root = _tree(tmp_path / "fixed", {"vllm/m.py": after, **modules}).root
    plan = plan_tree(VllmTree.open(root), [result.patch])
    assert plan.report("x#1").state is PatchState.APPLIED and not plan.edits

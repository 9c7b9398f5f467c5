"""derive's self-check on the commit's own parent (issue 40, item 3): the
shapes of upstream fixes that failed it, as small synthetic modules.

The fix is right on its parent by construction, so a failure there is the
tool's: each test here is one such class, derived and checked exactly as
``derive --commit`` checks it.
"""

from __future__ import annotations

from pathlib import Path

from deepstack_patch.authoring.derive import derive_patch_from_text

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
    )
    after = before.replace(
        "            self.b = 2\n\n",
        "            self.b = 2\n\n"
        "        # zero the blocks\n"
        "        if config.zero:\n"
        "            self.zero()\n\n",
    )
    assert derived_text(tmp_path, "vllm/w.py", before, after) == "text"

"""A derived rewrite keeps every byte the fix does not change (issue 34
item 3): where ``git apply`` applies, the written text is ``git apply``'s.

Each case is one way the rewrite used to lose text on real fixes (an
``elif`` added to a chain, a name dropped from a parenthesised import, a
comment above a replaced statement, a rewritten comment, an import added
after a group of imports); ``git apply``'s result is the diff's hunks
applied exactly, as ``derive`` applies a diff (``apply_file_diff``). Every
case runs on the skeleton the engine rewrites and on the whole module
(``DEEPSTACK_PATCH_FULL_REWRITE``): the same bytes. Small synthetic modules
only (no vLLM code).
"""

from __future__ import annotations

import ast
import difflib
import json
from pathlib import Path

import pytest
from deepstack_patch.authoring.derive import (
    apply_file_diff,
    derive_patch_from_text,
    parse_diff,
)
from deepstack_patch.engine import plan as plan_module
from deepstack_patch.engine.derived import load_derived
from deepstack_patch.engine.plan import rewrite_text
from deepstack_patch.engine.protocol import PatchState

from tests.test_derive import PATH, _tree, derived, git_diff, states


def git_applied(before: str, after: str, target: str) -> str:
    """``git apply`` of the diff from ``before`` to ``after`` on ``target``
    (3 lines of context, no fuzz)."""
    diff = "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{PATH}",
            f"b/{PATH}",
        )
    )
    (file_diff,) = parse_diff(diff)
    return apply_file_diff(file_diff, target)


def written(
    before: str, after: str, target: str, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The derived patch's rewrite of ``target``, the same on the skeleton
    and on the whole module, needed before and applied after."""
    patch = derived(before, after)
    assert {s for s, _ in states(patch, target).values()} == {PatchState.NEEDED}
    fast = rewrite_text(patch, target, PATH)
    monkeypatch.setenv(plan_module.FULL_REWRITE_ENV, "1")
    whole = rewrite_text(patch, target, PATH)
    monkeypatch.delenv(plan_module.FULL_REWRITE_ENV)
    assert fast == whole
    assert {s for s, _ in states(patch, fast).values()} == {PatchState.APPLIED}
    assert rewrite_text(patch, fast, PATH) == fast
    return fast


# -- an elif added to a chain -------------------------------------------------

CHAIN = '''import torch


def device_of(layer):
    # borrowed from the layers module
    """Where the layer's weights are."""
    if hasattr(layer, "inner"):
        layer = layer.inner

    # plain weights
    if hasattr(layer, "weight"):
        return layer.weight.device
    # packed weights
    elif hasattr(layer, "packed"):
        return layer.packed.device
    # experts
    elif hasattr(layer, "experts"):
        return layer.experts.device
    # packed experts
    elif hasattr(layer, "experts_packed"):
        return layer.experts_packed.device
    else:
        raise ValueError(f"Unsupported layer: {layer}")
'''

CHAIN_FIXED = CHAIN.replace(
    "    # experts\n",
    "    # quantized (AutoRound)\n"
    '    elif hasattr(layer, "qlinear"):\n'
    "        return layer.qlinear.qweight.device\n"
    "    # experts\n",
)


@pytest.mark.parametrize(
    "target",
    [
        CHAIN,
        # Another wording of a comment far from the change, a blank line more.
        CHAIN.replace("# plain weights", "# unquantized").replace(
            "import torch\n", "import torch\n\n"
        ),
        # A vendor's branch at the chain's end: the rest of the chain differs.
        CHAIN.replace(
            "    else:\n",
            '    elif hasattr(layer, "vendor"):\n'
            "        return layer.vendor\n"
            "    else:\n",
        ),
    ],
    ids=["base", "other-comment", "other-tail"],
)
def test_an_elif_added_to_a_chain_changes_only_its_lines(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every other branch keeps its comment and its double quotes, and the
    comment above the next branch stays there (vllm#47690)."""
    if "vendor" in target:  # the whole rest of the chain is what the fix replaces
        patch = derived(CHAIN, CHAIN_FIXED)
        assert {s for s, _ in states(patch, target).values()} == {PatchState.DRIFTED}
        return
    fixed = written(CHAIN, CHAIN_FIXED, target, monkeypatch)
    assert fixed == git_applied(CHAIN, CHAIN_FIXED, target)
    assert '    # quantized (AutoRound)\n    elif hasattr(layer, "qlinear"):\n' in fixed


STREAM = """def convert(state, content):
    total = len(content)
    state.seen += total
    state.count += 1
    if content == "":
        return None
    else:
        if state.kind != "text":
            state.kind = "text"
        return content
"""
#: vllm#45287's shape: the ``else:`` becomes ``elif ...:`` and ``else:``.
STREAM_FIXED = STREAM.replace(
    '    else:\n        if state.kind != "text":\n            state.kind = "text"\n'
    "        return content\n",
    '    elif state.kind == "tool":\n        state.pending.append(content)\n'
    '    else:\n        if state.kind != "text":\n            state.kind = "text"\n'
    "        return content\n",
)


@pytest.mark.parametrize(
    "target",
    [
        STREAM,
        # A line of the function the fix does not touch differs: the
        # function is not written whole from upstream's text.
        STREAM.replace("total = len(content)", "total = len(content) or 1"),
    ],
    ids=["base", "vendor-line"],
)
def test_an_else_the_fix_turns_into_an_elif_is_written_as_one(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``else:`` whose block the fix replaces with one ``if`` that
    upstream writes as an ``elif``: written as that ``elif``, as ``git
    apply`` writes it (it was an ``if`` inside the ``else:``, the same code,
    another text: vllm#45287 on 0.17.1-0.23.0)."""
    fixed = written(STREAM, STREAM_FIXED, target, monkeypatch)
    assert fixed == git_applied(STREAM, STREAM_FIXED, target)
    assert '    elif state.kind == "tool":\n' in fixed


def test_an_if_upstream_writes_inside_an_else_stays_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where upstream writes the new ``if`` inside the ``else:`` (no
    ``elif`` in its fixed code), the rewrite writes it there too."""
    nested = STREAM_FIXED.replace(
        '    elif state.kind == "tool":\n        state.pending.append(content)\n'
        "    else:\n",
        '    else:\n        if state.kind == "tool":\n'
        "            state.pending.append(content)\n        else:\n",
    ).replace(
        '        if state.kind != "text":\n            state.kind = "text"\n'
        "        return content\n",
        '            if state.kind != "text":\n                state.kind = "text"\n'
        "            return content\n",
    )
    assert ast.dump(ast.parse(nested)) == ast.dump(ast.parse(STREAM_FIXED))
    target = STREAM.replace("total = len(content)", "total = len(content) or 1")
    fixed = written(STREAM, nested, target, monkeypatch)
    assert fixed == git_applied(STREAM, nested, target)


def test_an_elif_header_changed_alone_stays_an_elif(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The header is carried alone: over a branch the target changed, it is
    still the target's ``elif`` with the fix's test."""
    after = CHAIN.replace('elif hasattr(layer, "experts"):', "elif layer.experts:")
    target = CHAIN.replace('raise ValueError(f"', 'raise TypeError(f"')
    fixed = written(CHAIN, after, target, monkeypatch)
    assert fixed == git_applied(CHAIN, after, target)
    target = CHAIN.replace("        return layer.experts.device\n", "        x = 1\n")
    fixed = written(CHAIN, after, target, monkeypatch)
    assert fixed == target.replace(
        'elif hasattr(layer, "experts"):', "elif layer.experts:"
    )


# -- imports ------------------------------------------------------------------

IMPORTS = """import time
from typing import Any

from vllm.net import (
    get_ip,
    get_port,
    is_v6,
)


def address(host: Any) -> str:
    if is_v6(host):
        host = f"[{host}]"
    return f"tcp://{host}:{get_port()}"
"""

IMPORTS_FIXED = IMPORTS.replace("    get_port,\n", "").replace(':{get_port()}"', ':0"')


@pytest.mark.parametrize(
    "target",
    [
        IMPORTS,
        # Not the recorded import statement: edited name by name.
        IMPORTS.replace("    get_ip,\n", "    get_ip,\n    get_path,\n"),
    ],
    ids=["base", "other-names"],
)
def test_a_name_dropped_from_a_parenthesised_import_keeps_the_layout(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own line goes; the trailing comma and the parenthesis stay
    (vllm#50960)."""
    fixed = written(IMPORTS, IMPORTS_FIXED, target, monkeypatch)
    expected = target.replace("    get_port,\n", "").replace(':{get_port()}"', ':0"')
    assert fixed == expected
    assert "    is_v6,\n)\n" in fixed
    if target == IMPORTS:
        assert fixed == git_applied(IMPORTS, IMPORTS_FIXED, target)


def test_the_last_name_dropped_gives_its_trailing_comma_to_the_one_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = IMPORTS.replace("get_port()", "get_port() or is_v6").replace(
        "    if is_v6(host):\n", "    if host:\n"
    )
    after = before.replace("    is_v6,\n", "").replace(" or is_v6", "")
    target = before.replace("    get_ip,\n", "    get_ip,\n    get_path,\n")
    fixed = written(before, after, target, monkeypatch)
    assert fixed == target.replace("    is_v6,\n", "").replace(" or is_v6", "")
    assert "    get_port,\n)\n" in fixed


ENVS = '''"""The protocol."""

import time
from typing import Any, Literal

from pydantic import BaseModel


class Request(BaseModel):
    stop: list[str] | None = None
    kind: Literal["a"] = "a"
    extra: Any = None
'''

ENVS_FIXED = (
    ENVS.replace(
        "from typing import Any, Literal", "from typing import Annotated, Any, Literal"
    )
    .replace(
        "from pydantic import BaseModel\n",
        "from pydantic import BaseModel\n\nimport vllm.envs as envs\n",
    )
    .replace(
        "    stop: list[str] | None = None\n",
        "    stop: (\n"
        "        Annotated[list[str], envs.MAX_STOP] | None\n"
        "    ) = None\n",
    )
)


def test_an_import_added_after_a_group_keeps_upstreams_blank_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new import group after the last one: a blank line before it, two
    after it, as upstream wrote it (vllm#51997)."""
    fixed = written(ENVS, ENVS_FIXED, ENVS, monkeypatch)
    assert fixed == ENVS_FIXED
    assert "BaseModel\n\nimport vllm.envs as envs\n\n\nclass" in fixed


# -- comments around replaced statements ----------------------------------------

BUFFERS = """class Proposer:
    def __init__(self, n, ctx):
        self.ctx = ctx

        # Only next tokens and mask tokens are query tokens
        self.max_query = n * 2
        # Positions cover both context and query states
        self.max_positions = self.ctx + self.max_query

        self.buffer = [0] * self.max_query
"""

BUFFERS_FIXED = BUFFERS.replace(
    "        # Positions cover",
    "        self.max_padded = max(\n"
    "            self.max_query,\n"
    "            8,\n"
    "        )\n"
    "        # Positions cover",
).replace("self.ctx + self.max_query\n", "self.ctx + self.max_padded\n")


@pytest.mark.parametrize(
    "target",
    [
        BUFFERS,
        BUFFERS.replace("        self.ctx = ctx\n", "        self.ctx = ctx  # kept\n"),
    ],
    ids=["base", "other-line"],
)
def test_a_comment_above_a_replaced_statement_stays_once_where_it_was(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new statement goes between the statement before and the comment,
    which stays once, above the statement it describes (vllm#50065)."""
    fixed = written(BUFFERS, BUFFERS_FIXED, target, monkeypatch)
    assert fixed == git_applied(BUFFERS, BUFFERS_FIXED, target)
    assert fixed.count("# Positions cover") == 1


DEVICES = """import os


def lenient():
    if os.name:
        # Check whether we run where CUDA_VISIBLE_DEVICES
        # may be empty (Ray sets it to "" during actor init)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        empty = visible is not None and not visible.strip()

        # Apply the lenient check there
        return empty
    return False
"""

DEVICES_FIXED = DEVICES.replace(
    "        # Check whether we run where CUDA_VISIBLE_DEVICES\n"
    '        # may be empty (Ray sets it to "" during actor init)\n'
    '        visible = os.environ.get("CUDA_VISIBLE_DEVICES")\n'
    "        empty = visible is not None and not visible.strip()\n",
    "        # Check whether we run where CUDA_VISIBLE_DEVICES\n"
    '        # or HIP_VISIBLE_DEVICES may be empty (Ray sets it to ""\n'
    "        # during actor init)\n"
    "        name = (\n"
    '            "HIP_VISIBLE_DEVICES"\n'
    '            if os.name == "rocm"\n'
    '            else "CUDA_VISIBLE_DEVICES"\n'
    "        )\n"
    "        visible = os.environ.get(name)\n"
    "        empty = visible is not None and len(visible.strip()) == 0\n",
)


def test_a_rewritten_comment_replaces_the_old_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The comment upstream rewrote is there once, in its new words
    (vllm#45998)."""
    target = DEVICES.replace("    return False\n", "    return None\n")
    fixed = written(DEVICES, DEVICES_FIXED, target, monkeypatch)
    assert fixed == git_applied(DEVICES, DEVICES_FIXED, target)
    assert '# may be empty (Ray sets it to "" during actor init)' not in fixed
    assert fixed.count("# Check whether we run where") == 1


# -- the definition whole ---------------------------------------------------


def test_what_upstream_changed_beside_the_statements_comes_with_the_definition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the definition is line for line the one the fix was made on,
    a comment or a docstring line upstream changed away from the statements
    it changes comes too; elsewhere the statements do, and the docstring and
    comment lines where the target's are the ones the fix edits (issue 34
    item 5: a docstring edit rides along; issue 40 item 5: comment lines
    too)."""
    before = (
        "def limit(n):\n"
        '    """Clamp n.\n'
        "\n"
        "    Negative values pass.\n"
        '    """\n'
        "    if n > 4:\n"
        "        # too big\n"
        "        n = 4\n"
        "    return n\n"
    )
    after = (
        before.replace("    Negative values pass.\n", "    Negative values are 0.\n")
        .replace("# too big", "# too large")
        .replace("return n", "return max(n, 0)")
    )
    assert written(before, after, before, monkeypatch) == after
    target = before.replace("if n > 4:", "if n > 4:  # the vendor's")
    fixed = written(before, after, target, monkeypatch)
    assert fixed == target.replace("return n", "return max(n, 0)").replace(
        "    Negative values pass.\n", "    Negative values are 0.\n"
    ).replace("# too big", "# too large")
    # A vendor's comment there is theirs: the fix's code, and nothing else.
    vendor = target.replace("# too big", "# the vendor's cap")
    fixed = written(before, after, vendor, monkeypatch)
    assert fixed == vendor.replace("return n", "return max(n, 0)").replace(
        "    Negative values pass.\n", "    Negative values are 0.\n"
    )


def test_a_fix_inside_a_nested_function_changes_only_the_lines_it_claims(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recognition claims the nested function the fix changes, and the
    comment upstream changed in the function around it, where the target's
    is the old one (the definition is not written whole there); a vendor's
    comment there stays theirs."""
    before = (
        "def outer(x):\n"
        "    def inner(y):\n"
        "        return y + 1\n"
        "\n"
        "    # add one\n"
        "    return inner(x)\n"
    )
    after = before.replace("# add one", "# add two").replace("y + 1", "y + 2")
    target = before.replace("    def inner(y):", "    def inner(y):  # ours")
    fixed = written(before, after, target, monkeypatch)
    assert fixed == after.replace("    def inner(y):", "    def inner(y):  # ours")
    vendor = target.replace("# add one", "# the vendor's")
    assert written(before, after, vendor, monkeypatch) == vendor.replace(
        "y + 1", "y + 2"
    )


# -- the target's own layout ----------------------------------------------------


def test_other_indentation_and_other_lines_keep_the_targets_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where ``git apply`` would not apply (the target indents by two, its
    statements are laid out otherwise), the target's lines stay its own and
    the fix's lines go in at the target's indentation, a string's lines as
    they are."""
    before = "def build(n):\n    size = n * 2\n    return [0] * size\n"
    after = (
        "def build(n):\n"
        "    size = n * 2\n"
        "    if size > 8:\n"
        '        raise ValueError("""too big:\n'
        '    at most 8""")\n'
        "    return [0] * size\n"
    )
    target = (
        "def build(n):\n"
        "  # the vendor's comment\n"
        "  size = (n *\n"
        "          2)\n"
        "  return [0] * size\n"
    )
    fixed = written(before, after, target, monkeypatch)
    assert fixed == (
        "def build(n):\n"
        "  # the vendor's comment\n"
        "  size = (n *\n"
        "          2)\n"
        "  if size > 8:\n"
        '      raise ValueError("""too big:\n'
        '    at most 8""")\n'
        "  return [0] * size\n"
    )
    assert ast.dump(ast.parse(fixed)) == ast.dump(ast.parse(after))


def test_a_replaced_statement_laid_out_otherwise_is_replaced_by_upstreams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The statement the fix replaces is the same code in another layout:
    its lines become upstream's, the comments around it stay."""
    target = BUFFERS.replace(
        "self.max_positions = self.ctx + self.max_query",
        "self.max_positions = (self.ctx +\n"
        "                              self.max_query)",
    )
    fixed = written(BUFFERS, BUFFERS_FIXED, target, monkeypatch)
    assert fixed == BUFFERS_FIXED


# -- derive's self-check compares the text ----------------------------------------


def test_derive_says_text_where_its_rewrite_is_the_diffs_result(
    tmp_path: Path,
) -> None:
    """The round trip is ``text`` for the chain (it was ``ast``: quotes and
    comments were lost); where a comment at the end of a line changes in a
    function whose code the fix does not change (comment lines are carried,
    such a comment is not), ``ast``, and a note names the line."""
    # Toy code (``layer.qlinear.qweight``): runtime names are not tested here.
    base = _tree(tmp_path / "base", {PATH: CHAIN}, partial=True)
    result = derive_patch_from_text(git_diff(PATH, CHAIN, CHAIN_FIXED), base, "l#1")
    assert result.round_trip == "text" and result.notes == []
    elsewhere = CHAIN + "\n\ndef other():\n    return 1  # old words\n"
    fixed = CHAIN_FIXED + "\n\ndef other():\n    return 1  # new words\n"
    base = _tree(tmp_path / "other", {PATH: elsewhere}, partial=True)
    result = derive_patch_from_text(git_diff(PATH, elsewhere, fixed), base, "l#2")
    assert result.round_trip == "ast"
    line = fixed.splitlines().index("    return 1  # new words") + 1
    assert result.notes == [
        f"{PATH}: the rewrite's text differs from the diff's result at line(s) "
        f"{line} of the result (the same code: a comment, docstring or blank line "
        "the fix changes away from the statements it changes is not carried)"
    ]


def test_what_derive_leaves_out_is_kept_and_shown_with_the_state(
    tmp_path: Path,
) -> None:
    """A comment at a line's end that the fix rewords, a file that is not
    Python: derive leaves them out, the data file keeps them
    (``not_carried``), and status shows them beside the patch's state, in
    text and JSON: its state speaks only of what it carries."""
    from click.testing import CliRunner
    from deepstack_patch.cli import main
    from deepstack_patch.engine.derived.data import write_derived

    elsewhere = CHAIN + "\n\ndef other():\n    return 1  # old words\n"
    fixed = CHAIN_FIXED + "\n\ndef other():\n    return 1  # new words\n"
    base = _tree(tmp_path / "base", {PATH: elsewhere}, partial=True)
    diff = git_diff(PATH, elsewhere, fixed) + git_diff("csrc/ops.cu", "a\n", "b\n")
    # CI's and the docs' files are no part of what a user runs: noted only.
    diff += git_diff(".buildkite/test_areas/misc.yaml", "a: 1\n", "a: 2\n")
    diff += git_diff("docs/usage.md", "old\n", "new\n")
    result = derive_patch_from_text(diff, base, "l#3")
    assert ".buildkite/test_areas/misc.yaml: not Python, left out" in result.notes
    line = fixed.splitlines().index("    return 1  # new words") + 1
    assert result.patch.not_carried == (
        "csrc/ops.cu: not Python, left out",
        f"{PATH}: the rewrite's text differs from the diff's result at line(s) "
        f"{line} of the result (the same code: a comment, docstring or blank line "
        "the fix changes away from the statements it changes is not carried)",
    )
    folder = tmp_path / "patches"
    folder.mkdir()
    data_file = write_derived(result.patch, folder)
    assert load_derived(data_file).not_carried == result.patch.not_carried
    tree = _tree(tmp_path / "tree", {PATH: elsewhere}, partial=True)
    args = ["--vllm-src", str(tree.root), "--patches", str(folder), "--only", "l#3"]
    shown = CliRunner().invoke(main, ["status", *args])
    assert shown.exit_code == 0, shown.output
    assert "not carried: csrc/ops.cu: not Python, left out" in shown.stdout
    assert f"not carried: {PATH}: the rewrite's text differs" in shown.stdout
    document = json.loads(
        CliRunner().invoke(main, ["status", *args, "--format", "json"]).stdout
    )
    (patch,) = [p for p in document["patches"] if p["id"] == "l#3"]
    assert patch["state"] == "needed"
    assert patch["not_carried"] == list(result.patch.not_carried)
    # A hand-edited data file that breaks the field is named.
    data_file.write_text(
        data_file.read_text().replace('"csrc/ops.cu: not Python, left out",', "1,")
    )
    refused = CliRunner().invoke(main, ["status", *args])
    assert refused.exit_code == 2
    assert "not_carried must be a list of text" in refused.output


# -- a data file derive wrote before ---------------------------------------------

OLD_DATA_FILE = """schema = 1
id = "local#9"
title = "t"
symptom = "s"
upstream_url = ""
fixed_in = ""
base = "0.0.1"
base_tree = ""
paths = ["vllm/buffers.py"]
requires = []

[[units]]
path = "vllm/buffers.py"
kind = "function"
name = "clamp"
before = \'\'\'
def clamp(n):
    # keep it small
    n = min(n, 4)
    return n
\'\'\'
after = \'\'\'
def clamp(n):
    # keep it small
    # and never negative
    n = max(min(n, 4), 0)
    return n
\'\'\'

[[units.edits]]
kind = "body"
block = [{header = "def clamp(n):\\n", field = "body"}]
after_anchor = {code = "return n", match = "statement"}
removed = \'\'\'
n = min(n, 4)
\'\'\'
inserted = \'\'\'
# and never negative
n = max(min(n, 4), 0)
\'\'\'
"""


def test_a_data_file_derive_wrote_before_still_loads_and_applies(
    tmp_path: Path,
) -> None:
    """A file whose edits record their statements without the lines around
    them (as derive wrote them before) loads, and its rewrite keeps the
    target's comment above the replaced statement, the fix's own after it."""
    data = tmp_path / "local-9.toml"
    data.write_text(OLD_DATA_FILE)
    patch = load_derived(data)
    target = "def clamp(n):\n    # keep it small\n    n = min(n, 4)\n    return n\n"
    fixed = rewrite_text(patch, target, PATH)
    assert fixed == (
        "def clamp(n):\n"
        "    # keep it small\n"
        "    # and never negative\n"
        "    n = max(min(n, 4), 0)\n"
        "    return n\n"
    )

"""Upstream's fixes as unified diffs, built at test time from the releases.

No vLLM code is committed: each diff is made from the release tarballs in the
cache (the release before the fix and the first release with it), restricted
to the units the pull request changed, so that a release's unrelated changes
in the same files do not enter the diff. A unit is a function, a method or a
class, taken whole from the release after (decorators included), or one
module-level ``from X import (...)`` statement, whose imported names must
differ only by the names the pull request added.

The "after" side is never the hand-written patch's output: that would make
the comparison of a derived patch with the hand-written one circular.

Per fix (what the pull request changed was read from its page and checked
against the two releases' diff of these units: every unit below changes
between the two releases, and in none of them does anything else change):

vllm#38933, 0.19.1 -> 0.20.0
    ``vllm/v1/sample/ops/logprobs.py``: ``batched_count_greater_than`` (its
    decorator loses ``dynamic=True``, two ``torch._check`` lines);
    ``vllm/v1/sample/sampler.py``: ``Sampler.gather_logprobs`` (two
    ``mark_unbacked`` calls and their comment). 0.20.0 also changed
    ``Sampler.forward`` and added ``gather_specific_token_logprobs`` and an
    import (the generative scoring API): left out. The pull request's test,
    ``tests/v1/sample/test_batched_count_greater_than.py``, is new in 0.20.0
    and is added whole.
vllm#40932, 0.20.1 -> 0.20.2
    ``_get_deepstack_input_embeds`` and ``_clear_deepstack_input_embeds`` of
    ``Qwen3VLForConditionalGeneration`` (``qwen3_vl.py``) and
    ``Qwen3OmniMoeThinkerForConditionalGeneration``
    (``qwen3_omni_moe_thinker.py``): the two bounds checks removed. These are
    the only changes of the two files between the releases.
vllm#40917, 0.20.2 -> 0.21.0
    ``Granite4VisionForConditionalGeneration.forward``
    (``granite4_vision.py``): ``n = inputs_embeds.size(0)`` and the ``[:n]``
    slice; the file's only change between the releases.
vllm#43617, 0.22.1 -> 0.23.0
    ``_get_``, the new ``_resize_`` and ``_set_deepstack_input_embeds`` of
    the same two classes. 0.23.0 also changed ``qwen3_vl.py``'s encoder
    CUDA-graph methods and video embedding (other pull requests): left out.
vllm#49397, 0.27.1 -> 0.28.0
    The three ``__init__``s (``Qwen3VLForConditionalGeneration``,
    ``Qwen3VLMoeForConditionalGeneration``,
    ``Qwen3OmniMoeThinkerForConditionalGeneration``) and each file's
    ``from .utils import`` gaining ``StageMissingLayer``. 0.28.0 changed
    much else in these files (other imports, the encoder, weight loading):
    left out.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

QWEN3_VL = "vllm/model_executor/models/qwen3_vl.py"
QWEN3_VL_MOE = "vllm/model_executor/models/qwen3_vl_moe.py"
THINKER = "vllm/model_executor/models/qwen3_omni_moe_thinker.py"
QWEN3_VL_CLASS = "Qwen3VLForConditionalGeneration"
THINKER_CLASS = "Qwen3OmniMoeThinkerForConditionalGeneration"


@dataclass(frozen=True)
class ImportChange:
    """One ``from MODULE import ...`` statement and the names the fix added."""

    module: str  # as written, leading dots included: ".utils"
    added: frozenset[str]


@dataclass(frozen=True)
class FileChange:
    path: str
    units: tuple[str, ...] = ()  # qualified names: "Class.method"
    imports: tuple[ImportChange, ...] = ()


@dataclass(frozen=True)
class UpstreamFix:
    id: str
    before: str  # the last release without the fix
    after: str  # the first release with it
    files: tuple[FileChange, ...]
    new_tests: tuple[str, ...] = field(default=())  # test files the PR added


def _deepstack_methods(*names: str) -> tuple[FileChange, ...]:
    return tuple(
        FileChange(path, tuple(f"{cls}.{name}" for name in names))
        for path, cls in ((QWEN3_VL, QWEN3_VL_CLASS), (THINKER, THINKER_CLASS))
    )


def _stage_missing_import() -> tuple[ImportChange, ...]:
    return (ImportChange(".utils", frozenset({"StageMissingLayer"})),)


FIXES: dict[str, UpstreamFix] = {
    fix.id: fix
    for fix in (
        UpstreamFix(
            "vllm#38933",
            "0.19.1",
            "0.20.0",
            (
                FileChange(
                    "vllm/v1/sample/ops/logprobs.py", ("batched_count_greater_than",)
                ),
                FileChange("vllm/v1/sample/sampler.py", ("Sampler.gather_logprobs",)),
            ),
            new_tests=("tests/v1/sample/test_batched_count_greater_than.py",),
        ),
        UpstreamFix(
            "vllm#40932",
            "0.20.1",
            "0.20.2",
            _deepstack_methods(
                "_get_deepstack_input_embeds", "_clear_deepstack_input_embeds"
            ),
        ),
        UpstreamFix(
            "vllm#40917",
            "0.20.2",
            "0.21.0",
            (
                FileChange(
                    "vllm/model_executor/models/granite4_vision.py",
                    ("Granite4VisionForConditionalGeneration.forward",),
                ),
            ),
        ),
        UpstreamFix(
            "vllm#43617",
            "0.22.1",
            "0.23.0",
            _deepstack_methods(
                "_get_deepstack_input_embeds",
                "_resize_deepstack_input_embeds",
                "_set_deepstack_input_embeds",
            ),
        ),
        UpstreamFix(
            "vllm#49397",
            "0.27.1",
            "0.28.0",
            (
                FileChange(
                    QWEN3_VL, (f"{QWEN3_VL_CLASS}.__init__",), _stage_missing_import()
                ),
                FileChange(
                    QWEN3_VL_MOE,
                    ("Qwen3VLMoeForConditionalGeneration.__init__",),
                    _stage_missing_import(),
                ),
                FileChange(
                    THINKER, (f"{THINKER_CLASS}.__init__",), _stage_missing_import()
                ),
            ),
        ),
    )
}


# -- locating units ----------------------------------------------------------------

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def definitions(module: ast.Module) -> dict[str, tuple[Definition, list[ast.stmt]]]:
    """Every function, method and class by qualified name, with its parent body."""
    found: dict[str, tuple[Definition, list[ast.stmt]]] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            match node:
                case ast.FunctionDef() | ast.AsyncFunctionDef():
                    found[prefix + node.name] = (node, body)
                case ast.ClassDef():
                    found[prefix + node.name] = (node, body)
                    walk(node.body, f"{prefix}{node.name}.")

    walk(module.body, "")
    return found


def first_line(node: ast.stmt) -> int:
    """A definition's first line, its decorators included."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def import_from(module: ast.Module, name: str) -> ast.ImportFrom:
    """The one module-level ``from NAME import ...`` statement."""
    level = len(name) - len(name.lstrip("."))
    found = [
        node
        for node in module.body
        if isinstance(node, ast.ImportFrom)
        and node.level == level
        and (node.module or "") == name.lstrip(".")
    ]
    assert len(found) == 1, f"{len(found)} statements 'from {name} import'"
    return found[0]


# -- the restricted "after" and its diff -------------------------------------------

#: A replacement of lines [start, end) (0-based) of the "before" text.
Replacement = tuple[int, int, list[str]]


def restricted_after(before: str, after: str, change: FileChange) -> str:
    """``before`` with only ``change``'s units taken from ``after``."""
    before_lines = before.splitlines(keepends=True)
    after_lines = after.splitlines(keepends=True)
    before_tree, after_tree = ast.parse(before), ast.parse(after)
    before_defs, after_defs = definitions(before_tree), definitions(after_tree)
    replacements: list[Replacement] = []
    for qualname in change.units:
        assert qualname in after_defs, f"{change.path}: no {qualname} after the fix"
        new, body = after_defs[qualname]
        new_text = after_lines[first_line(new) - 1 : new.end_lineno]
        if qualname in before_defs:
            old = before_defs[qualname][0]
            old_text = before_lines[first_line(old) - 1 : old.end_lineno]
            assert old_text != new_text, f"{change.path}: {qualname} did not change"
            replacements.append((first_line(old) - 1, old.end_lineno, new_text))
            continue
        # A new unit goes after the sibling that precedes it upstream, with
        # the lines between them as upstream has them.
        index = body.index(new)
        assert index > 0, f"{change.path}: {qualname} has no preceding sibling"
        sibling = body[index - 1]
        parent = qualname.rpartition(".")[0]
        sibling_name = f"{parent}.{sibling.name}" if parent else sibling.name
        old_sibling = before_defs[sibling_name][0]
        inserted = after_lines[sibling.end_lineno : new.end_lineno]
        replacements.append((old_sibling.end_lineno, old_sibling.end_lineno, inserted))
    for change_import in change.imports:
        old = import_from(before_tree, change_import.module)
        new = import_from(after_tree, change_import.module)
        old_names = {alias.name for alias in old.names}
        new_names = {alias.name for alias in new.names}
        assert old_names ^ new_names == change_import.added, (
            f"{change.path}: 'from {change_import.module} import' changed "
            f"{sorted(old_names ^ new_names)}, not only {sorted(change_import.added)}"
        )
        new_text = after_lines[new.lineno - 1 : new.end_lineno]
        replacements.append((old.lineno - 1, old.end_lineno, new_text))
    lines = list(before_lines)
    for start, end, text in sorted(replacements, key=lambda r: r[0], reverse=True):
        lines[start:end] = text
    result = "".join(lines)
    _check_restriction(result, after, change)
    return result


def _check_restriction(result: str, after: str, change: FileChange) -> None:
    """Each unit is upstream's; the result parses."""
    result_defs = definitions(ast.parse(result))
    after_defs = definitions(ast.parse(after))
    for qualname in change.units:
        assert ast.dump(result_defs[qualname][0]) == ast.dump(
            after_defs[qualname][0]
        ), f"{change.path}: {qualname} is not upstream's"


def git_diff(path: str, before: str | None, after: str) -> str:
    """One file's diff as ``git diff`` writes it (``before`` None: a new file)."""
    old = before.splitlines(keepends=True) if before is not None else []
    new = after.splitlines(keepends=True)
    assert all(line.endswith("\n") for line in old + new), f"{path}: no final newline"
    header = f"diff --git a/{path} b/{path}\n"
    if before is None:
        header += "new file mode 100644\n"
    hunks = difflib.unified_diff(
        old, new, "/dev/null" if before is None else f"a/{path}", f"b/{path}", n=3
    )
    return header + "".join(hunks)


def upstream_diff(fix_id: str, release_root: Callable[[str], Path]) -> str:
    """The unified diff of ``fix_id`` against its base release (``fix.before``)."""
    fix = FIXES[fix_id]
    before_root, after_root = release_root(fix.before), release_root(fix.after)
    parts = []
    for change in fix.files:
        before = (before_root / change.path).read_text()
        after = (after_root / change.path).read_text()
        parts.append(
            git_diff(change.path, before, restricted_after(before, after, change))
        )
    for test in fix.new_tests:
        assert not (before_root / test).exists(), f"{test} is not new in {fix.after}"
        parts.append(git_diff(test, None, (after_root / test).read_text()))
    return "".join(parts)


def restricted_tree(fix_id: str, release_root: Callable[[str], Path]) -> dict[str, str]:
    """Every file the diff touches, as the diff leaves it (for checking it)."""
    fix = FIXES[fix_id]
    before_root, after_root = release_root(fix.before), release_root(fix.after)
    files = {
        change.path: restricted_after(
            (before_root / change.path).read_text(),
            (after_root / change.path).read_text(),
            change,
        )
        for change in fix.files
    }
    files.update({test: (after_root / test).read_text() for test in fix.new_tests})
    return files

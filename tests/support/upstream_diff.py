"""Upstream diffs built at test time from two cached release tarballs.

No vLLM code is committed: a test names the files, the definitions and the
imported names a fix changed, and the diff is cut from the two releases here
(each named definition of the earlier release replaced by the later one's;
the import statement that brings each named symbol likewise).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence
from pathlib import Path

from deepstack_patch.distribution.matrix import status_tree
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.fetch.releases import release_archive


def release_files(version: str, paths: Sequence[str]) -> VllmTree:
    """A cached partial extraction of ``paths`` from the release's tarball."""
    return status_tree(release_archive(version), version, sorted(paths))


def definition_spans(text: str) -> dict[str, tuple[int, int]]:
    """Qualified name -> 1-based lines (decorators included) of every def/class."""
    found: dict[str, tuple[int, int]] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + node.name
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found[name] = (first, node.end_lineno or node.lineno)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, name + ".")

    walk(ast.parse(text).body, "")
    return found


def _import_of(text: str, symbol: str) -> tuple[ast.ImportFrom, int, int] | None:
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom) and any(
            (a.asname or a.name) == symbol for a in node.names
        ):
            return node, node.lineno, node.end_lineno or node.lineno
    return None


def restricted_after(
    before: str, after: str, names: Sequence[str], symbols: Sequence[str] = ()
) -> str:
    """``before`` with the named definitions (and the imports of ``symbols``)
    as ``after`` has them."""
    old_lines = before.splitlines(keepends=True)
    new_lines = after.splitlines(keepends=True)
    old, new = definition_spans(before), definition_spans(after)
    replacements = [(old[name], new[name]) for name in names]
    for symbol in symbols:
        fixed = _import_of(after, symbol)
        assert fixed is not None, f"{symbol} is not imported in the later release"
        node, first, last = fixed
        same_module = [
            (n.lineno, n.end_lineno or n.lineno)
            for n in ast.parse(before).body
            if isinstance(n, ast.ImportFrom)
            and (n.module, n.level) == (node.module, node.level)
        ]
        assert same_module, f"no import from {node.module} in the earlier release"
        replacements.append((same_module[0], (first, last)))
    for (old_first, old_last), (new_first, new_last) in sorted(
        replacements, reverse=True
    ):
        old_lines[old_first - 1 : old_last] = new_lines[new_first - 1 : new_last]
    return "".join(old_lines)


def file_diff(path: str, before: str, after: str) -> str:
    """A ``git diff`` of one file."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        f"a/{path}",
        f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def new_file_diff(path: str, content: str) -> str:
    """A ``git diff`` that adds the file ``path``."""
    lines = content.splitlines(keepends=True)
    body = "".join("+" + line for line in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n"
        f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def upstream_diff(
    earlier: str,
    later: str,
    changes: dict[str, tuple[Sequence[str], Sequence[str]]],
) -> str:
    """The diff of ``changes`` (path -> (definitions, imported symbols))
    between two releases, restricted to them."""
    old_tree = release_files(earlier, list(changes))
    new_tree = release_files(later, list(changes))
    parts = []
    for path, (names, symbols) in changes.items():
        before = Path(old_tree.root, path).read_text()
        after = Path(new_tree.root, path).read_text()
        parts.append(
            file_diff(path, before, restricted_after(before, after, names, symbols))
        )
    return "".join(parts)

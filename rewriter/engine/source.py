"""One Python file of a tree: its bytes, decoded text and parse trees.

The file is read once. Its CPython ``ast`` is built on first use (recognition
is cheap); its LibCST module only when a patch rewrites it. LibCST parses the
original bytes, so it keeps the file's encoding, BOM and newline style, and
regenerates every untouched byte exactly.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import copy
import io
import re
import tokenize
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deepstack_patch.engine.errors import DeepstackError

if TYPE_CHECKING:
    import libcst


@dataclass
class SourceFile:
    relpath: str
    raw: bytes
    _text: str | None = field(default=None, repr=False)
    _ast: ast.Module | None = field(default=None, repr=False)
    _cst: libcst.Module | None = field(default=None, repr=False)

    @property
    def encoding(self) -> str:
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(self.raw).readline)
        except SyntaxError as exc:
            raise DeepstackError(
                f"cannot tell the file's encoding: {exc}",
                "fix or remove the coding declaration at the top of the file",
                path=self.relpath,
            ) from None
        return encoding

    @property
    def text(self) -> str:
        if self._text is None:
            encoding = self.encoding
            try:
                self._text = self.raw.decode(encoding)
            except UnicodeDecodeError as exc:
                line = self.raw[: exc.start].count(b"\n") + 1
                raise DeepstackError(
                    f"bytes that are not valid {encoding} "
                    f"({exc.reason} at byte {exc.start})",
                    "restore the file from the release, or declare its encoding "
                    "with a '# -*- coding: ... -*-' line",
                    path=self.relpath,
                    line=line,
                ) from None
        return self._text

    @property
    def ast(self) -> ast.Module:
        if self._ast is None:
            _ = self.text  # bytes that do not decode are told as such
            try:
                self._ast = parsed(self.raw)
            except SyntaxError as exc:
                raise DeepstackError(
                    f"syntax error: {exc.msg}",
                    "the file does not parse as Python; restore it from the "
                    "release before patching",
                    path=self.relpath,
                    line=exc.lineno,
                ) from None
        _PARSED_FROM.setdefault(self._ast, self.raw)
        return self._ast

    @property
    def cst(self) -> libcst.Module:
        if self._cst is None:
            import libcst

            try:
                self._cst = libcst.parse_module(self.raw)
            except libcst.ParserSyntaxError as exc:
                raise DeepstackError(
                    f"cannot parse: {exc.message}",
                    "restore the file from the release before patching",
                    path=self.relpath,
                    line=exc.raw_line,
                ) from None
        return self._cst

    def edited(self, raw: bytes, first_changed: int) -> SourceFile:
        """This file with new bytes ``raw``, identical to this file's before
        line ``first_changed`` (0-based).

        The new file's ast keeps this file's statements that end before that
        line, and parses only the rest (the rewritten definitions and what
        follows them), preceded by as many empty lines so that line numbers
        come out as a whole parse gives them. Where the first statement to
        parse again is a module-level class, its statements before the line
        are kept too (most of a big file is one class: a first status of 40
        derived fixes parsed 2.2 MB again for 46 rewrites). Where that
        cannot be cut cleanly the ast is left to a whole parse, on first use.
        """
        edited = SourceFile(self.relpath, raw)
        if self.encoding != "utf-8" or raw.startswith(b"\xef\xbb\xbf"):
            return edited
        if (whole := _PARSES.get(raw)) is not None:
            edited._ast = whole
            return edited
        body = self.ast.body
        kept = _kept_before(body, first_changed)
        if kept is None:
            return edited
        lines = raw.splitlines(keepends=True)
        if kept < len(body) and isinstance(body[kept], ast.ClassDef):
            # Where the class cannot be cut, the module is, before it.
            with contextlib.suppress(SyntaxError, UnicodeDecodeError):
                edited._ast = _class_cut(body, kept, lines, first_changed, self.relpath)
            if edited._ast is not None:
                _keep(raw, edited._ast)
                return edited
        cut = (body[kept - 1].end_lineno or 0) if kept else 0
        try:
            rest = _parsed_from_line(lines, cut, b"", self.relpath)
        except (SyntaxError, UnicodeDecodeError):
            return edited  # the whole parse reports it, with its position
        edited._ast = ast.Module(body=[*body[:kept], *rest.body], type_ignores=[])
        _keep(raw, edited._ast)
        return edited

    @classmethod
    def from_cst(cls, relpath: str, module: libcst.Module) -> SourceFile:
        return cls(relpath=relpath, raw=module.bytes, _cst=module)


def parsed(raw: bytes) -> ast.Module:
    """The ast of the module ``raw`` (SyntaxError or ValueError where it
    does not parse), parsed once for every reader while any holds it: a
    first status of 40 derived fixes parsed each file up to four times (to
    recognise it, to cut the skeleton of its rewrite, for its imports and
    for its interface), a tenth of its time. No reader changes a tree:
    every transform works on a copy (rename.py, footprint.py)."""
    found = _PARSES.get(raw)
    if found is None:
        found = ast.parse(raw)
        _keep(raw, found)
    return found


def _keep(raw: bytes, module: ast.Module) -> None:
    _PARSES[raw] = module
    if _RECENT is not None:
        _RECENT.append(module)  # held a while after its last reader lets go


@contextlib.contextmanager
def keeping_parses() -> Iterator[None]:
    """Hold the last trees parsed a while after their readers let go, for
    as long as this lasts (a plan): a tree kept after it, its hundreds of
    thousands of nodes walked by every collection of the cycle collector,
    made a built-in ``apply`` a quarter slower."""
    global _RECENT
    outer = _RECENT  # a plan made inside another keeps the outer one's
    _RECENT = outer if outer is not None else collections.deque(maxlen=64)
    try:
        yield
    finally:
        _RECENT = outer


#: Each tree by its bytes, while a reader (or ``_RECENT``) holds it.
_PARSES: weakref.WeakValueDictionary[bytes, ast.Module] = weakref.WeakValueDictionary()
_RECENT: collections.deque[ast.Module] | None = None


#: The bytes each module the engine parsed came from (see :func:`parsed_from`).
_PARSED_FROM: weakref.WeakKeyDictionary[ast.Module, bytes] = weakref.WeakKeyDictionary()


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def code_lines(text: str) -> list[str]:
    """The lines of ``text`` with their ends, as Python counts them: only
    ``\\n``, ``\\r\\n`` and ``\\r`` end a line. (``str.splitlines`` also
    splits at form feeds and Unicode line separators, which Python code and
    git's hunk headers may hold inside a line.)"""
    return _LINE.findall(text)


def parsed_from(tree: ast.Module) -> bytes | None:
    """The file bytes the engine parsed ``tree`` from; None for a tree it did
    not parse (a patch's example, a test).

    A recogniser may rule a name out of a whole file with one byte search
    before it walks thousands of nodes looking for it, as the engine's
    markers rule files out before parsing them.
    """
    return _PARSED_FROM.get(tree)


def _kept_before(body: list[ast.stmt], first_changed: int) -> int | None:
    """How many of ``body``'s statements end before the 0-based line
    ``first_changed``; None where the next one starts on the line the last
    of them ends on (``a = 1; b = 2``): no clean cut."""
    kept = 0
    while kept < len(body) and (body[kept].end_lineno or 0) <= first_changed:
        kept += 1
    cut = (body[kept - 1].end_lineno or 0) if kept else 0
    if kept < len(body) and _first_line(body[kept]) <= cut:
        return None
    return kept


def _class_cut(
    body: list[ast.stmt], at: int, lines: list[bytes], first_changed: int, path: str
) -> ast.Module | None:
    """The module whose statements before ``body[at]``, a class, and that
    class's own statements before the 0-based line ``first_changed`` are
    ``body``'s; the rest parsed from ``lines``. None where no statement of
    the class ends before that line, or none can be cut cleanly.

    The class's statements after the cut are parsed as the body of an
    ``if 1:`` laid on the last kept line: they stand at the class body's
    indentation, so the tokens, and each node's line and column, are those
    of a whole parse; the module's statements after the class follow."""
    inner = body[at]
    assert isinstance(inner, ast.ClassDef)
    kept = _kept_before(inner.body, first_changed)
    if not kept:  # nothing of the class to keep, or no clean cut
        return None
    cut = inner.body[kept - 1].end_lineno or 0
    wrapper, *after = _parsed_from_line(lines, cut, b"if 1:\n", path).body
    # The first statement parsed is indented as the last one kept, to the
    # byte (tabs and spaces alike): a deeper one continues it (a method's
    # ``def`` line dropped: its body joins the method before). An ``else:``
    # after the class would join the ``if``: no whole parse takes it.
    if (
        not isinstance(wrapper, ast.If)
        or wrapper.lineno != cut
        or _indent(lines, wrapper.body[0]) != _indent(lines, inner.body[kept - 1])
        or wrapper.orelse
    ):
        return None
    rewritten = copy.copy(inner)  # the old tree is shared: never changed
    rewritten.body = [*inner.body[:kept], *wrapper.body]
    last = rewritten.body[-1]
    rewritten.end_lineno, rewritten.end_col_offset = (
        last.end_lineno,
        last.end_col_offset,
    )
    return ast.Module(body=[*body[:at], rewritten, *after], type_ignores=[])


def _indent(lines: list[bytes], node: ast.stmt) -> bytes:
    """The blanks that begin the first line of ``node``."""
    line = lines[_first_line(node) - 1]
    return line[: len(line) - len(line.lstrip(b" \t\f"))]


def _parsed_from_line(
    lines: list[bytes], cut: int, opener: bytes, path: str
) -> ast.Module:
    """``lines`` after the first ``cut`` parsed where they stand: line
    ``cut`` holds ``opener`` (or nothing), the lines before it nothing."""
    padding = b"\n" * (cut - 1) + opener if opener else b"\n" * cut
    return ast.parse((padding + b"".join(lines[cut:])).decode("utf-8"), filename=path)


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])

"""One Python file of a tree: its bytes, decoded text and parse trees.

The file is read once. Its CPython ``ast`` is built on first use (recognition
is cheap); its LibCST module only when a patch rewrites it. LibCST parses the
original bytes, so it keeps the file's encoding, BOM and newline style, and
regenerates every untouched byte exactly.
"""

from __future__ import annotations

import ast
import io
import tokenize
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
            try:
                self._ast = ast.parse(self.text, filename=self.relpath)
            except SyntaxError as exc:
                raise DeepstackError(
                    f"syntax error: {exc.msg}",
                    "the file does not parse as Python; restore it from the "
                    "release before patching",
                    path=self.relpath,
                    line=exc.lineno,
                ) from None
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

    @classmethod
    def from_cst(cls, relpath: str, module: libcst.Module) -> SourceFile:
        return cls(relpath=relpath, raw=module.bytes, _cst=module)

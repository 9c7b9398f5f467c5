"""Unified diffs as GitHub serves a pull request's (``/pull/N.diff``),
``git diff`` or ``git format-patch`` writes them, or ``diff -u``: parsed by
`unidiff <https://pypi.org/project/unidiff/>`_ into files and hunks, and
applied to a file exactly (no fuzz).

What is ours: the lines handed to unidiff (ended as Python ends a line, so a
CRLF diff reads as git reads it), what derive asks of each file (its paths,
binary, renamed, added or deleted, where it starts), the refusal of what
unidiff would skip in silence (a malformed hunk header), and the exact apply.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.source import code_lines
from unidiff import Hunk, PatchedFile, PatchSet, UnidiffParseError
from unidiff.constants import (
    DEV_NULL,
    RE_HUNK_HEADER,
    RE_SOURCE_FILENAME,
    RE_TARGET_FILENAME,
)

BASE_HINT = (
    "give the release (--base) or tree (--base-src) the pull request was made "
    "against: its diff applies exactly there"
)
_UNCHANGED_HINT = (
    "give the diff unchanged, as git or GitHub wrote it (an editor may have "
    "cut lines or trailing spaces)"
)


@dataclass
class FileDiff:
    """One file of a diff: what derive reads of it."""

    #: The file's paths before and after (``a/``, ``b/`` taken off); None
    #: for ``/dev/null``.
    old_path: str | None
    new_path: str | None
    hunks: list[Hunk]
    binary: bool
    rename: bool
    new_file: bool
    deleted: bool
    #: The diff's line where the file starts (``diff --git``, or ``---``).
    line: int

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def parse_diff(text: str, name: str = "diff") -> list[FileDiff]:
    """The files of a unified diff; a DeepstackError if it is not one."""
    lines = [line.rstrip("\r\n") for line in code_lines(text)]
    _refuse_malformed_hunk_headers(lines, name)
    read = _Numbered(lines)
    try:
        patch_set = PatchSet(read)
    except UnidiffParseError as exc:
        raise DeepstackError(
            f"a malformed diff: {exc}", _UNCHANGED_HINT, path=name, line=read.number
        ) from None
    if not patch_set:
        raise DeepstackError(
            "not a diff: no file header (diff --git, or ---/+++ lines) in it",
            "give a unified diff: GitHub serves a PR's at "
            "https://github.com/OWNER/REPO/pull/N.diff; git diff or git "
            "format-patch writes one",
            path=name,
        )
    return [_file_diff(patched, lines) for patched in patch_set]


class _Numbered:
    """The diff's lines as unidiff reads them (each ended by ``\\n``),
    remembering the number of the last one read: where a parse error is."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.number = 0

    def __iter__(self) -> Iterator[str]:
        for number, line in enumerate(self.lines, 1):
            self.number = number
            yield line + "\n"


def _refuse_malformed_hunk_headers(lines: list[str], name: str) -> None:
    """A line that opens like a hunk and is not one: unidiff would take it,
    and the hunk's lines after it, as text between files, and derive would
    carry the rest of the diff without that hunk."""
    for number, line in enumerate(lines, 1):
        if line.startswith("@@") and RE_HUNK_HEADER.match(line) is None:
            raise DeepstackError(
                f"a malformed hunk header: {line!r}",
                "give the diff unchanged, as git or GitHub wrote it",
                path=name,
                line=number,
            )


def _file_diff(patched: PatchedFile, lines: list[str]) -> FileDiff:
    old, new = _side_names(patched, lines)
    start = patched.diff_line_no or 0
    if start > 1 and lines[start - 1].startswith("+++ "):
        start -= 1  # a file without a git header starts at its --- line
    return FileDiff(
        old_path=_path(old),
        new_path=_path(new),
        hunks=list(patched),
        binary=is_binary(patched),
        rename=_is_git(patched) and patched.is_rename,
        new_file=old == DEV_NULL,
        deleted=new == DEV_NULL,
        line=start,
    )


def is_binary(patched: PatchedFile) -> bool:
    """A binary file: ``Binary files ... differ`` or a ``GIT binary patch``."""
    return patched.is_binary_file


def _is_git(patched: PatchedFile) -> bool:
    info = patched.patch_info or []
    return bool(info) and info[0].startswith("diff --git ")


def _side_names(patched: PatchedFile, lines: list[str]) -> tuple[str, str]:
    """The names of the file's ``---`` and ``+++`` lines where it has them,
    else the ones unidiff read (from the ``diff --git`` header, ``new file
    mode``, ``deleted file mode``): unidiff keeps a git header's names over
    what its ``---``/``+++`` lines say, and a ``--- /dev/null`` there adds a
    file as git apply reads it."""
    old, new = patched.source_file, patched.target_file
    if patched:
        first_body_line = patched[0][0].diff_line_no if patched[0] else None
        if first_body_line is not None and first_body_line >= 4:
            source = RE_SOURCE_FILENAME.match(lines[first_body_line - 4])
            target = RE_TARGET_FILENAME.match(lines[first_body_line - 3])
            if source and target:
                old, new = source.group("filename"), target.group("filename")
    return old, new


def _path(name: str | None) -> str | None:
    if name is None or name == DEV_NULL:
        return None
    name = name.strip()
    return name[2:] if name.startswith(("a/", "b/")) else name


def apply_file_diff(file_diff: FileDiff, base_text: str) -> str:
    """The file after the diff: every hunk applies exactly (no fuzz; a hunk
    may sit at other lines than its header says, as git apply allows)."""
    base = code_lines(base_text)
    plain = [line.rstrip("\r\n") for line in base]
    out: list[str] = []
    position = 0
    for number, hunk in enumerate(file_diff.hunks, 1):
        old = [line.value.rstrip("\n") for line in hunk.source_lines()]
        new = [line.value.rstrip("\n") for line in hunk.target_lines()]
        start = hunk.source_start - 1 if hunk.source_length else hunk.source_start
        found = _nearest(plain, old, start, position)
        if found is None:
            raise DeepstackError(
                f"hunk {number} ({hunk_header(hunk)}) of {file_diff.path} does not "
                "apply: " + _mismatch(plain, old, max(start, position)),
                BASE_HINT,
                path=file_diff.path,
                line=hunk.source_start,
            )
        out.extend(base[position:found])
        out.extend(text + "\n" for text in new)
        if new and _new_side_ends_without_newline(hunk):
            out[-1] = out[-1][:-1]
        position = found + len(old)
    out.extend(base[position:])
    return "".join(out)


def hunk_header(hunk: Hunk) -> str:
    """The hunk's ``@@`` line as git writes it (a count of 1 left out)."""

    def span(start: int, count: int) -> str:
        return str(start) if count == 1 else f"{start},{count}"

    where = (
        f"@@ -{span(hunk.source_start, hunk.source_length)} "
        f"+{span(hunk.target_start, hunk.target_length)} @@"
    )
    return f"{where} {hunk.section_header}" if hunk.section_header else where


def _new_side_ends_without_newline(hunk: Hunk) -> bool:
    """``\\ No newline at end of file`` after the hunk's last new line."""
    return any(
        marker.line_type == "\\" and line.line_type in (" ", "+")
        for line, marker in zip(hunk, hunk[1:], strict=False)
    )


def _nearest(plain: list[str], old: list[str], start: int, earliest: int) -> int | None:
    size = len(old)
    for distance in range(len(plain) + 1):
        for at in (start - distance, start + distance) if distance else (start,):
            if earliest <= at <= len(plain) - size and plain[at : at + size] == old:
                return at
    return None


def _mismatch(plain: list[str], old: list[str], start: int) -> str:
    for offset, expected in enumerate(old):
        at = start + offset
        if at >= len(plain):
            return f"the file ends at line {len(plain)}, the hunk expects more"
        if plain[at] != expected:
            return (
                f"line {at + 1} is {plain[at].strip()[:60]!r}, "
                f"the hunk expects {expected.strip()[:60]!r}"
            )
    return "its lines are not there"

"""Unified diffs as GitHub serves a pull request's (``/pull/N.diff``),
``git diff`` or ``git format-patch`` writes them, or ``diff -u``: parsed into
files and hunks, and applied to a file exactly (no fuzz)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.source import code_lines

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")

BASE_HINT = (
    "give the release (--base) or tree (--base-src) the pull request was made "
    "against: its diff applies exactly there"
)


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    #: (" " | "-" | "+", the line's text without its newline)
    lines: list[tuple[str, str]]
    header: str
    #: The hunk's line in the diff file.
    line: int
    old_ends_without_newline: bool = False
    new_ends_without_newline: bool = False


@dataclass
class FileDiff:
    old_path: str | None
    new_path: str | None
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False
    rename: bool = False
    new_file: bool = False
    deleted: bool = False
    line: int = 0

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def parse_diff(text: str, name: str = "diff") -> list[FileDiff]:
    """The files of a unified diff; a DeepstackError if it is not one."""
    lines = [line.rstrip("\r\n") for line in code_lines(text)]
    files: list[FileDiff] = []
    current: FileDiff | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        number = index + 1
        if line.startswith("diff --git "):
            paths = _git_paths(line[len("diff --git ") :])
            current = FileDiff(paths[0], paths[1], line=number)
            files.append(current)
        elif (
            current is not None
            and not current.hunks
            and line.startswith(
                ("new file mode", "deleted file mode", "rename from", "rename to")
            )
        ):
            if line.startswith("new file mode"):
                current.new_file = True
            elif line.startswith("deleted file mode"):
                current.deleted = True
            elif line.startswith("rename from "):
                current.rename, current.old_path = True, line[len("rename from ") :]
            else:
                current.rename, current.new_path = True, line[len("rename to ") :]
        elif line.startswith("Binary files ") or line == "GIT binary patch":
            if current is None:
                current = FileDiff(None, None, line=number)
                files.append(current)
            current.binary = True
        elif (
            line.startswith("--- ")
            and index + 1 < len(lines)
            and lines[index + 1].startswith("+++ ")
        ):
            old, new = _header_path(line[4:]), _header_path(lines[index + 1][4:])
            if current is None or current.hunks or current.binary:
                current = FileDiff(old, new, line=number)
                files.append(current)
            else:
                current.old_path, current.new_path = old, new
            current.new_file = current.new_file or old is None
            current.deleted = current.deleted or new is None
            index += 1
        elif line.startswith("@@"):
            if current is None:
                raise DeepstackError(
                    f"a hunk before any file header (line {number})",
                    "give a whole unified diff (the PR's .diff, git diff, or "
                    "git format-patch output)",
                    path=name,
                    line=number,
                )
            hunk, index = _read_hunk(lines, index, name)
            current.hunks.append(hunk)
            continue
        index += 1
    if not files:
        raise DeepstackError(
            "not a diff: no file header (diff --git, or ---/+++ lines) in it",
            "give a unified diff: GitHub serves a PR's at "
            "https://github.com/OWNER/REPO/pull/N.diff; git diff or git "
            "format-patch writes one",
            path=name,
        )
    return files


def _git_paths(rest: str) -> tuple[str | None, str | None]:
    match = re.match(r"a/(.*) b/(.*)$", rest)
    if match:
        return match.group(1), match.group(2)
    return None, None


def _header_path(text: str) -> str | None:
    text = text.split("\t")[0].strip()
    if text == "/dev/null":
        return None
    if text.startswith(("a/", "b/")):
        return text[2:]
    return text


def _read_hunk(lines: list[str], index: int, name: str) -> tuple[Hunk, int]:
    header = lines[index]
    match = _HUNK.match(header)
    if match is None:
        raise DeepstackError(
            f"a malformed hunk header: {header!r}",
            "give the diff unchanged, as git or GitHub wrote it",
            path=name,
            line=index + 1,
        )
    old_start, old_count, new_start, new_count = (
        int(match.group(1)),
        int(match.group(2) or 1),
        int(match.group(3)),
        int(match.group(4) or 1),
    )
    hunk = Hunk(old_start, old_count, new_start, new_count, [], header, index + 1)
    old_seen = new_seen = 0
    index += 1
    while index < len(lines) and (old_seen < old_count or new_seen < new_count):
        line = lines[index]
        tag, text = (line[:1], line[1:]) if line else (" ", "")
        if tag == "\\":
            index += 1
            continue
        if tag not in " -+":
            break
        hunk.lines.append((tag, text))
        old_seen += tag in " -"
        new_seen += tag in " +"
        index += 1
    if (old_seen, new_seen) != (old_count, new_count):
        raise DeepstackError(
            f"hunk {header} ends early: {old_seen} of {old_count} old and "
            f"{new_seen} of {new_count} new lines",
            "give the diff unchanged, as git or GitHub wrote it (an editor may "
            "have cut lines or trailing spaces)",
            path=name,
            line=hunk.line,
        )
    # "\ No newline at end of file" right after the hunk's last old/new line.
    position = index
    while position < len(lines) and lines[position].startswith("\\"):
        previous = hunk.lines[-1][0] if hunk.lines else " "
        if previous in " -":
            hunk.old_ends_without_newline = True
        if previous in " +":
            hunk.new_ends_without_newline = True
        position += 1
    return hunk, position


def apply_file_diff(file_diff: FileDiff, base_text: str) -> str:
    """The file after the diff: every hunk applies exactly (no fuzz; a hunk
    may sit at other lines than its header says, as git apply allows)."""
    base = code_lines(base_text)
    plain = [line.rstrip("\r\n") for line in base]
    out: list[str] = []
    position = 0
    for number, hunk in enumerate(file_diff.hunks, 1):
        old = [text for tag, text in hunk.lines if tag in " -"]
        new = [text for tag, text in hunk.lines if tag in " +"]
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        found = _nearest(plain, old, start, position)
        if found is None:
            raise DeepstackError(
                f"hunk {number} ({hunk.header}) of {file_diff.path} does not "
                "apply: " + _mismatch(plain, old, max(start, position)),
                BASE_HINT,
                path=file_diff.path,
                line=hunk.old_start,
            )
        out.extend(base[position:found])
        newline = "\n"
        out.extend(text + newline for text in new)
        if new and hunk.new_ends_without_newline:
            out[-1] = out[-1][:-1]
        position = found + len(old)
    out.extend(base[position:])
    return "".join(out)


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

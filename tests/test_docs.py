"""The documentation holds together: every relative link and ``#anchor`` in
README.md and docs/*.md resolves, and README stays short.

Anchors are checked against the slugs GitHub gives headings: the heading's
text without its markdown, lower-cased, every character that is not a
letter, a digit, a space, ``-`` or ``_`` dropped, spaces turned into ``-``,
and ``-1``, ``-2``... appended to repeats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 300

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)"
)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclass(frozen=True)
class Link:
    source: Path
    line: int
    target: str


def documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    lines, in_fence = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            lines.append((number, line))
    return lines


def heading_text(markdown: str) -> str:
    """What GitHub renders of a heading: code spans keep their text as it
    is, links their label, and emphasis markers outside code go."""
    rendered, last = [], 0
    for code in INLINE_CODE.finditer(markdown):
        rendered += [strip_inline_markup(markdown[last : code.start()]), code.group(2)]
        last = code.end()
    return "".join([*rendered, strip_inline_markup(markdown[last:])])


def strip_inline_markup(text: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", text)


def slug(heading: str) -> str:
    kept = "".join(
        char
        for char in heading_text(heading).lower()
        if char.isalnum() or char in " -_"
    )
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The slugs of a page's headings, repeats numbered as github-slugger
    numbers them."""
    occurrences: dict[str, int] = {}
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        heading = HEADING.match(line)
        if heading is None:
            continue
        original = result = slug(heading.group(2))
        while result in occurrences:
            occurrences[original] += 1
            result = f"{original}-{occurrences[original]}"
        occurrences[result] = 0
    return set(occurrences)


def links(path: Path) -> list[Link]:
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        without_code = INLINE_CODE.sub("", line)
        found += [Link(path, number, m.group(1)) for m in LINK.finditer(without_code)]
    return found


def broken(link: Link, root: Path = ROOT) -> str | None:
    """Why ``link`` does not resolve, or None when it does."""
    if SCHEME.match(link.target):
        return None  # a web address: not this test's business
    file_part, _, anchor = link.target.partition("#")
    target = (link.source.parent / file_part).resolve() if file_part else link.source
    where = f"{link.source.relative_to(root)}:{link.line}: {link.target}"
    if not target.exists():
        return f"{where}: no such file {target}"
    if not anchor:
        return None
    if target.suffix != ".md":
        return f"{where}: an anchor into a file that is not markdown"
    if anchor not in anchors(target):
        return f"{where}: no heading in {target.name} has the slug #{anchor}"
    return None


def test_readme_stays_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines; move detail into docs/"
    )


def test_every_relative_link_and_anchor_resolves() -> None:
    every_link = [link for path in documents() for link in links(path)]
    relative = [link for link in every_link if not SCHEME.match(link.target)]
    assert len(documents()) > 1 and relative, "no documents or no relative links"
    assert any("#" in link.target for link in relative), "no anchor was checked"
    problems = [problem for link in relative if (problem := broken(link))]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_docs_page_is_linked_from_readme() -> None:
    linked = {
        (README.parent / link.target.partition("#")[0]).resolve()
        for link in links(README)
        if not SCHEME.match(link.target)
    }
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages
    assert [page.name for page in pages if page.resolve() not in linked] == []


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        (
            "The main job: patch a release without a checkout",
            "the-main-job-patch-a-release-without-a-checkout",
        ),
        (
            "`apply --commit`: one commit per patch",
            "apply---commit-one-commit-per-patch",
        ),
        (
            "`verify --installed`: the release's own tests against the install",
            "verify---installed-the-releases-own-tests-against-the-install",
        ),
        (
            "JSON output (`--format json`, schema 1)",
            "json-output---format-json-schema-1",
        ),
        ("In this repository's tests", "in-this-repositorys-tests"),
        ("`patches/_follow_ups.py` and *why*", "patches_follow_upspy-and-why"),
    ],
)
def test_slug_is_githubs(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n## Twice\n\n## Twice\n\n"
        "[ok](#a-page) [ok](#twice-1) [file](other.md#title)\n"
        "[gone](missing.md) [no anchor](#nowhere) [repeat](#twice-2)\n"
        "[bad anchor](other.md#absent) `[in code](missing.md)`\n"
        "```\n[in a fence](missing.md)\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "other.md").write_text("# Title\n", encoding="utf-8")
    found = links(page)
    assert [link.target for link in found] == [
        "#a-page",
        "#twice-1",
        "other.md#title",
        "missing.md",
        "#nowhere",
        "#twice-2",
        "other.md#absent",
    ]
    verdicts = {link.target: broken(link, root=tmp_path) for link in found}
    assert [target for target, why in verdicts.items() if why] == [
        "missing.md",
        "#nowhere",
        "#twice-2",
        "other.md#absent",
    ]

"""The documentation holds together: every relative link and ``#anchor`` in
README.md and docs/*.md resolves, README stays short, and the examples that
list the series or count its fixes or files are what the tool prints today.

An example made by a real run is a fenced block right under a line
``<!-- generated: deepstack-patch ARGS -->``: the test runs that command in the
repository and compares its output with the block (timings aside).
``python tests/test_docs.py --update`` runs them all and writes the blocks.

Anchors are checked against the slugs GitHub gives headings: the heading's
text without its markdown, lower-cased, every character that is not a
letter, a digit, a space, ``-`` or ``_`` dropped, spaces turned into ``-``,
and ``-1``, ``-2``... appended to repeats.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.plans import ReleasePlans

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


# --- examples made by real runs -------------------------------------------------

GENERATED = re.compile(r"^<!-- generated: deepstack-patch (.+?) -->$")
#: What differs from run to run: durations.
TIMINGS = re.compile(r"\b\d+(?:\.\d+)? (s|ms)\b")


@dataclass(frozen=True)
class Generated:
    source: Path
    args: str
    #: the block's content: lines[start:stop] of the page
    start: int
    stop: int

    def content(self) -> str:
        lines = self.source.read_text(encoding="utf-8").split("\n")
        return "\n".join(lines[self.start : self.stop])


def generated_blocks(path: Path) -> list[Generated]:
    """Each ``<!-- generated: ... -->`` line and the fenced block under it."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found = []
    for number, line in enumerate(lines):
        marker = GENERATED.match(line)
        if marker is None:
            continue
        where = f"{path.name}:{number + 1}"
        assert number + 1 < len(lines) and FENCE.match(lines[number + 1]), (
            f"{where}: a generated marker must be right above a fenced block"
        )
        stop = next(
            (i for i in range(number + 2, len(lines)) if FENCE.match(lines[i])), None
        )
        assert stop is not None, f"{where}: the fenced block is not closed"
        found.append(Generated(path, marker.group(1), number + 2, stop))
    return found


def every_generated_block() -> list[Generated]:
    return [block for path in documents() for block in generated_blocks(path)]


def run_for_docs(args: str) -> str:
    """What ``deepstack-patch ARGS`` prints in a pipe, run in the repository."""
    result = subprocess.run(
        [sys.executable, "-m", "deepstack_patch", *shlex.split(args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.rstrip("\n")


def without_timings(text: str) -> str:
    return TIMINGS.sub(r"N \1", text)


def test_the_examples_that_list_the_series_are_generated() -> None:
    blocks = every_generated_block()
    assert {block.args for block in blocks} >= {"matrix --jobs 2"}


@pytest.mark.release
@pytest.mark.parametrize("block", every_generated_block(), ids=lambda block: block.args)
def test_a_generated_example_is_what_the_command_prints(block: Generated) -> None:
    printed = run_for_docs(block.args)
    assert printed, f"deepstack-patch {block.args} printed nothing"
    assert without_timings(block.content()) == without_timings(printed), (
        f"{block.source.name}: the example of `deepstack-patch {block.args}` is "
        "stale; run python tests/test_docs.py --update"
    )


def update(blocks: list[Generated], run: Callable[[str], str] = run_for_docs) -> int:
    """Write each block's command output into its page; the number changed."""
    changed = 0
    for block in reversed(blocks):  # from the end: earlier line numbers hold
        lines = block.source.read_text(encoding="utf-8").split("\n")
        printed = run(block.args).split("\n")
        if lines[block.start : block.stop] != printed:
            lines[block.start : block.stop] = printed
            block.source.write_text("\n".join(lines), encoding="utf-8")
            changed += 1
    return changed


def test_update_rewrites_only_the_block_under_its_marker(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n<!-- generated: deepstack-patch list -->\n```\nold\nlines\n```\n"
        "\n```\nnot generated\n```\n",
        encoding="utf-8",
    )
    blocks = generated_blocks(page)
    assert [(b.args, b.content()) for b in blocks] == [("list", "old\nlines")]
    assert update(blocks, run=lambda args: f"new {args}") == 1
    assert page.read_text(encoding="utf-8") == (
        "# Page\n\n<!-- generated: deepstack-patch list -->\n```\nnew list\n```\n"
        "\n```\nnot generated\n```\n"
    )
    assert update(generated_blocks(page), run=lambda args: f"new {args}") == 0


# --- counts and lists of the series in prose and trimmed examples ------------


def series_ids() -> list[str]:
    from deepstack_patch.patches import SERIES

    return [patch.id for patch in SERIES]


def test_readme_table_lists_the_whole_series_in_order() -> None:
    rows = [
        re.match(r"\| \[(vllm#\d+)\]", line)
        for line in README.read_text(encoding="utf-8").splitlines()
    ]
    assert [row.group(1) for row in rows if row] == series_ids()


def test_trimmed_examples_name_the_whole_series() -> None:
    """A JSON ``series`` list and the live check's log line in the docs."""
    ids = series_ids()
    text = "\n".join(path.read_text(encoding="utf-8") for path in documents())
    lists = re.findall(r'"series": \[((?:"vllm#\d+"(?:, )?)+)\]', text)
    live = re.findall(r"fixes live: ((?:vllm#\d+(?:, )?)+)", text)
    assert lists and live, "no example lists the series"
    for found in lists:
        assert re.findall(r"vllm#\d+", found) == ids
    # the live check on 0.20.2 names every fix that applies there: all of them
    for found in live:
        assert re.findall(r"vllm#\d+", found) == ids


# --- how often a derived patch writes the hand-written code: one place --------

#: The one page that states it (issue 31): its table, and its prose.
FIGURES = ROOT / "docs" / "derived-vs-series.md"
PERCENT = re.compile(r"(?<![\w.%])(\d{1,3}(?:\.\d+)?) ?%(?!\w)")
OF_CELLS = re.compile(r"\b(\d+) of (\d+) cells\b")


def derived_share() -> tuple[int, int]:
    """Cells where the series writes, and those the derived patches got
    right: the table's row of the five fixes together."""
    text = FIGURES.read_text(encoding="utf-8")
    [(cells, same)] = re.findall(r"^\| all five \| (\d+) \| (\d+) \|", text, re.M)
    return int(same), int(cells)


def paragraphs(text: str) -> list[str]:
    """The prose of a page (fenced blocks left out), paragraph by paragraph."""
    joined = "\n".join(line for _, line in prose_lines(text))
    return [part for part in re.split(r"\n\s*\n", joined) if part.strip()]


def other_shares(text: str, same: int, cells: int) -> list[str]:
    """The shares a page states of what derived patches get right that are
    not ``same`` of ``cells``: a paragraph about derived patches with another
    percentage, or other counts of cells."""
    share = round(100 * same / cells)
    wrong = []
    for paragraph in paragraphs(text):
        if not re.search(r"\bderive", paragraph, re.IGNORECASE):
            continue
        flat = " ".join(paragraph.split())
        wrong += [m[0] for m in PERCENT.finditer(flat) if float(m[1]) != share]
        wrong += [
            m[0]
            for m in OF_CELLS.finditer(flat)
            if (int(m[1]), int(m[2])) != (same, cells)
        ]
    return wrong


def test_the_derived_patches_share_is_stated_in_one_place() -> None:
    """docs/derived-vs-series.md keeps the figure, its prose as its table; a
    page that states it elsewhere states the same (better: links to it)."""
    same, cells = derived_share()
    text = FIGURES.read_text(encoding="utf-8")
    stated = re.findall(
        r"\*\*Correct where the series writes:\*\* (\d+) of (\d+) cells \((\d+)%\)",
        text,
    )
    assert stated == [(str(same), str(cells), str(round(100 * same / cells)))]
    wrong = {
        str(path.relative_to(ROOT)): found
        for path in documents()
        if path != FIGURES
        and (found := other_shares(path.read_text(encoding="utf-8"), same, cells))
    }
    assert wrong == {}


def test_a_page_with_another_share_is_caught() -> None:
    page = (
        "Intro.\n\nOver the cells where the hand-written patch writes a derived\n"
        "patch was right on 68% (122 of 180 cells).\n\n"
        "```\nderived 99%\n```\n\nA 0.20.2%2Bdeepstack.1 purl, 50% of nothing.\n"
    )
    assert other_shares(page, 144, 180) == ["68%", "122 of 180 cells"]
    assert (
        other_shares(page.replace("68%", "80%").replace("122", "144"), 144, 180) == []
    )


# --- the test tiers README names ---------------------------------------------

#: README's fast tier: ``python -m pytest -m "EXPRESSION"`` in its prose.
FAST_TIER = re.compile(r'`python -m pytest -m "([^"`]+)"`')


def readme_ci_commands() -> list[str]:
    """The fenced block after the ``<!-- ci:`` marker, as .ci/run reads it."""
    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- ci:", 1)[1].split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip()]


def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_readme_names_the_fast_tier_and_it_leaves_out_the_slow_tests() -> None:
    """CI's two commands stay; the fast tier beside them selects by markers
    pytest knows, and leaves out every test that downloads a release or
    needs the proof environment."""
    from deepstack_patch.engine.targets import tomllib

    assert readme_ci_commands() == [
        "python -m pip install -e '.[test]'",
        "python -m pytest",
    ]
    [expression] = FAST_TIER.findall(README.read_text(encoding="utf-8"))
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    options = config["tool"]["pytest"]["ini_options"]
    registered = {marker.split(":")[0] for marker in options["markers"]}
    named = set(re.findall(r"\w+", expression)) - {"not", "and", "or"}
    assert named == {"release", "verify"} <= registered, expression
    files = ["tests/test_docs.py", "tests/test_locations.py"]
    everything = pytest_run("--co", "-q", *files)
    fast = pytest_run("--co", "-q", "-m", expression, *files)
    assert everything.returncode == fast.returncode == 0, fast.stdout + fast.stderr
    ids = [line for line in everything.stdout.splitlines() if "::" in line]
    kept = [line for line in fast.stdout.splitlines() if "::" in line]
    slow = [
        "tests/test_locations.py::test_apply_prints_the_lines_of_the_files_it_wrote",
        "tests/test_docs.py::test_installed_md_counts_the_files_the_series_changes",
    ]
    assert set(slow) <= set(ids) and not set(slow) & set(kept)
    assert "tests/test_docs.py::test_readme_stays_short" in kept


def test_pytest_prints_the_30_slowest_tests() -> None:
    """README's ``python -m pytest`` (CI's) ends with the 30 slowest tests,
    and with the run's wall time and each tier's tests and time
    (tests/support/budget.py: the guard docs/testing.md names)."""
    result = pytest_run("tests/test_docs.py::test_readme_stays_short")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"=+ slowest 30 durations =+", result.stdout), result.stdout
    budget = result.stdout.partition("time budget (docs/testing.md)")[2]
    assert re.search(r"^wall time (\d+m)?\d+s for 1 tests$", budget, re.M), (
        result.stdout
    )
    assert re.search(r"^  fast +1 tests +(\d+m)?\d+s \(100% ", budget, re.M), budget
    assert "release x patch facts asserted: 0" in budget, budget


# --- the suite's size, stated once (issue 36 item 8) --------------------------

TESTING = ROOT / "docs" / "testing.md"
#: docs/testing.md's sentence with the suite's size (the one place it is said).
COUNTS = re.compile(
    r"The\s+suite\s+holds\s+\*\*([\d,]+)\s+tests\*\*;\s+the\s+fast\s+tier\s+runs\s+"
    r"\*\*([\d,]+)\*\*\s+of\s+them"
)


def collected_counts() -> tuple[int, int]:
    """(every test, the fast tier's tests), as ``pytest --collect-only``
    counts them: one collection, the slow tiers selected."""
    result = pytest_run("--co", "-q", "-m", "release or verify")
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(
        r"^(\d+)/(\d+) tests collected \((\d+) deselected\)", result.stdout, re.M
    )
    assert found, result.stdout[-2000:]
    slow, total, fast = map(int, found.groups())
    assert slow + fast == total and slow and fast
    return total, fast


def stated_counts(text: str) -> list[tuple[int, int]]:
    return [
        (int(a.replace(",", "")), int(b.replace(",", "")))
        for a, b in COUNTS.findall(text)
    ]


def test_testing_md_counts_the_tests_collection_reports() -> None:
    """docs/testing.md states the suite's size and the fast tier's as
    collection counts them, in one sentence; README states no count (it
    points to docs/testing.md), so no figure there can go stale.
    ``python tests/test_docs.py --counts`` rewrites the sentence."""
    assert stated_counts(TESTING.read_text(encoding="utf-8")) == [collected_counts()]
    readme = README.read_text(encoding="utf-8")
    assert not re.search(r"\b\d[\d,]* tests\b", readme), "README counts tests"
    assert "docs/testing.md" in readme


def test_a_stale_count_is_caught() -> None:
    text = "The suite holds **1,339 tests**; the fast tier runs **850** of them.\n"
    assert stated_counts(text) == [(1339, 850)]
    assert stated_counts(update_counts_in(text, (1402, 871))) == [(1402, 871)]
    assert stated_counts("the suite holds 1,339 tests") == []
    wrapped = "The suite holds **1,339\ntests**; the fast tier runs **850**\nof them"
    assert stated_counts(wrapped) == [(1339, 850)]


def update_counts_in(text: str, counts: tuple[int, int]) -> str:
    total, fast = counts
    return COUNTS.sub(
        f"The suite holds **{total:,} tests**; the fast tier runs **{fast:,}** of them",
        text,
    )


@pytest.mark.release
def test_installed_md_counts_the_files_the_series_changes(
    release_plan: ReleasePlans,
) -> None:
    """docs/installed.md's count of the files (and ``.pyc``) the series
    changes in the 0.20.2 wheel is the plan's: a fact about the page."""
    plan = release_plan("0.20.2")
    files = len(plan.edits)
    assert files
    text = (ROOT / "docs" / "installed.md").read_text(encoding="utf-8")
    [said] = re.findall(r"0\.20\.2 wheel \((\d+) files, (\d+) `\.pyc`\)", text)
    assert said == (str(files), str(files))


def update_counts() -> tuple[int, int]:
    """Write what collection counts into docs/testing.md's sentence."""
    counts = collected_counts()
    text = TESTING.read_text(encoding="utf-8")
    TESTING.write_text(update_counts_in(text, counts), encoding="utf-8")
    return counts


if __name__ == "__main__":
    # --update: every generated example and the counts; --counts: the counts.
    if sys.argv[1:] not in (["--update"], ["--counts"]):
        sys.exit("usage: python tests/test_docs.py --update | --counts")
    if sys.argv[1] == "--update":
        print(f"{update(every_generated_block())} example(s) rewritten")
    total, fast = update_counts()
    print(f"docs/testing.md: {total:,} tests, {fast:,} in the fast tier")

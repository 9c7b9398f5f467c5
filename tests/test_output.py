"""Plain output (a pipe, a log) says what rich would say, without rich."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from deepstack_patch.engine.plan import plan_tree
from deepstack_patch.engine.tree import VllmTree
from deepstack_patch.output import tables
from deepstack_patch.output.plain import (
    PlainConsole,
    PlainTable,
    escape,
    new_table,
    strip_markup,
)
from deepstack_patch.patches import SERIES
from rich.console import Console
from rich.markup import escape as rich_escape
from rich.text import Text

MARKUP = [
    "plain words",
    "[bold red]error:[/] vllm/x.py:12 no such thing",
    "[dim](fixed in 0.20.0)[/] [green](applied now)[/]",
    "list[int] and dict[str, int] stay",
    "a [link] in a [b]sentence[/b]",
    r"escaped \[dim] tag and \\[dim]kept backslash[/]",
    "unclosed [ bracket and ] bracket",
    "[#ff0000]hex[/] [@click]action[/]",
    "trailing backslash \\",
    "",
]


def rich_text(console_output: Console) -> str:
    text = console_output.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip(" ") for line in text.split("\n"))


def rich_console() -> Console:
    """rich as it would print to a pipe that never folds a line."""
    return Console(
        file=io.StringIO(), highlight=False, soft_wrap=True, width=10_000, emoji=False
    )


@pytest.mark.parametrize("markup", MARKUP)
def test_markup_is_stripped_as_rich_renders_it(markup: str) -> None:
    assert strip_markup(markup) == Text.from_markup(markup, emoji=False).plain


@pytest.mark.parametrize("text", MARKUP)
def test_escape_is_rich_escape_and_prints_text_unchanged(text: str) -> None:
    assert escape(text) == rich_escape(text)
    shown = strip_markup(escape(text))
    assert shown == Text.from_markup(escape(text), emoji=False).plain
    # rich doubles a trailing backslash (so that a tag after it stays a tag)
    assert shown == (text + "\\" if text.endswith("\\") else text)


ROWS = [
    ("vllm#38933", "[yellow]needed[/]", "Sampler fix [dim](fixed in 0.20.0)[/]"),
    ("", "  [yellow]needed[/]", "  part compiled-count"),
    ("", "", "  vllm/v1/sample/ops/logprobs.py:11 f\n    [dim]why it is so[/]"),
    ("vllm#40917", "[dim]not-applicable[/]", ""),
    ("a-much-longer-patch-id", "≠ drifted", "[bold red]x ≠ y[/]"),
]


@pytest.mark.parametrize("boxed", [False, True], ids=["columns", "boxed"])
def test_tables_read_the_same_on_a_wide_terminal_and_in_a_pipe(boxed: bool) -> None:
    plain_out = io.StringIO()
    plain, rich = PlainConsole(plain_out), rich_console()
    for console in (plain, rich):
        table = new_table(console, boxed=boxed)
        assert isinstance(table, PlainTable)
        for header in ("patch", "state", "title / where"):
            table.add_column(header, no_wrap=True)
        for row in ROWS:
            table.add_row(*row)
        console.print(table)
        console.print("[green]verified[/] in 1.0 s")
    assert plain_out.getvalue() == rich_text(rich)
    assert plain_out.getvalue().splitlines()[:2] == [
        "patch                   state           title / where",
        "vllm#38933              needed          Sampler fix (fixed in 0.20.0)",
    ]


def test_a_narrow_table_breaks_between_whole_fields() -> None:
    location = "  vllm/models/qwen3_omni_moe_thinker.py:1773"
    table = PlainTable(box=None)
    for header in ("patch", "state", "where"):
        table.add_column(header)
    table.add_row("vllm#40932", "applied", "Qwen3-VL deepstack: drop the bounds checks")
    table.add_row("", "", f"{location} Foo.forward")
    # the last column wraps at spaces beside the others
    assert table.lines(width=70) == [
        "patch       state    where",
        "vllm#40932  applied  Qwen3-VL deepstack: drop the bounds checks",
        "                       vllm/models/qwen3_omni_moe_thinker.py:1773",
        "                       Foo.forward",
    ]
    wrapped = PlainTable(box=None)
    for header in ("patch", "state", "where"):
        wrapped.add_column(header)
    wrapped.add_row(
        "vllm#1", "needed", "drop the bounds checks that reject padded steps"
    )
    assert wrapped.lines(width=40) == [
        "patch   state   where",
        "vllm#1  needed  drop the bounds checks",
        "                that reject padded steps",
    ]
    # a field too long to sit beside the others: the column goes under them,
    # every row alike; a field longer than the line gets a line of its own
    long_symbol = (
        "Qwen3OmniMoeThinkerForConditionalGeneration._get_deepstack_input_embeds"
    )
    table.add_row("", "", f"{location} {long_symbol}")
    assert table.lines(width=50) == [
        "patch       state",
        "    where",
        "vllm#40932  applied",
        "    Qwen3-VL deepstack: drop the bounds checks",
        "      vllm/models/qwen3_omni_moe_thinker.py:1773",
        "      Foo.forward",
        "      vllm/models/qwen3_omni_moe_thinker.py:1773",
        long_symbol,
    ]
    # the same table unbounded: one line a row
    assert table.lines()[3].endswith(long_symbol)
    # On a terminal narrower than that field, rich folds it: no character
    # is cut (a csrc path of 84 characters in `not carried: ...`).
    from rich.console import Console

    console = Console(width=len(long_symbol) - 10, record=True, file=io.StringIO())
    console.print(table)
    shown = console.export_text().splitlines()
    assert max(map(len, shown)) <= len(long_symbol) - 10
    assert "".join(line.strip() for line in shown).endswith(long_symbol)


def test_columns_that_do_not_fit_side_by_side_come_in_groups() -> None:
    table = PlainTable(box=None)
    for header in ("release", "vllm#1", "vllm#2", "vllm#3"):
        table.add_column(header, no_wrap=True)
    table.add_row("0.20.2", "not-applicable", "not-applicable", "applied")
    assert table.lines(width=40) == [
        "release  vllm#1          vllm#2",
        "0.20.2   not-applicable  not-applicable",
        "",
        "release  vllm#3",
        "0.20.2   applied",
    ]


def test_plain_console_prints_unmarked_text_as_given() -> None:
    out = io.StringIO()
    PlainConsole(out).print("[red]not a style[/]   ", markup=False)
    assert out.getvalue() == "[red]not a style[/]\n"


def test_plain_status_spinner_writes_nothing_as_rich_in_a_pipe() -> None:
    plain_out = io.StringIO()
    plain, rich = PlainConsole(plain_out), rich_console()
    for console in (plain, rich):
        assert not console.is_terminal
        with console.status("working") as status:
            status.update("still working")
        console.print("done")
    assert plain_out.getvalue() == rich_text(rich) == "done\n"


def test_a_pipe_gets_the_plain_console_and_a_terminal_gets_rich() -> None:
    from deepstack_patch.output.progress import console_for

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(console_for(io.StringIO()), PlainConsole)
    assert isinstance(console_for(Terminal()), Console)


@pytest.mark.release
def test_status_table_of_a_release_reads_the_same_either_way(
    release_tree: object,
) -> None:
    root: Path = release_tree("0.20.0")  # type: ignore[operator]
    plan = plan_tree(VllmTree.open(root), SERIES)
    plain_out = io.StringIO()
    plain, rich = PlainConsole(plain_out), rich_console()
    for console in (plain, rich):
        tables.print_tree_header(console, plan.tree)
        tables.print_plan_table(console, plan)
    assert "vllm#43617" in plain_out.getvalue()
    assert plain_out.getvalue() == rich_text(rich)


@pytest.mark.release
def test_status_shows_what_a_patch_travels_with(release_tree: object) -> None:
    """README: `status` shows the companion relation (and what a fix requires)."""
    root: Path = release_tree("0.20.2")  # type: ignore[operator]
    plan = plan_tree(VllmTree.open(root), SERIES)
    out = io.StringIO()
    tables.print_plan_table(PlainConsole(out), plan)
    lines = out.getvalue().splitlines()
    after = {
        line.split()[0]: lines[number + 1].strip()
        for number, line in enumerate(lines[:-1])
        if line.startswith("vllm#")
    }
    assert after["vllm#43617"] == "requires vllm#40932; companions: vllm#49397"
    assert after["vllm#49397"] == "companion of vllm#43617"


def test_a_step_quick_as_a_rule_says_nothing_and_a_long_one_says_how_far(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``status`` reports its plan with ``after``: piped, no line for a
    quick run, then one every few seconds and the last where it ends."""
    from deepstack_patch.output import progress as progress_module

    clock = iter(range(0, 1000))  # one second per reading of the clock
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(progress_module, "is_terminal", lambda stream: False)
    # An in-process --format json run before this one leaves it quiet.
    monkeypatch.setattr(progress_module, "quiet", False)
    interval = progress_module.PLAIN_INTERVAL
    with progress_module.progress("quick", "items", after=100) as update:
        update(1, None, "a.py")
    assert capsys.readouterr().err == ""
    with progress_module.progress("long", "items", after=interval) as update:
        for done in range(1, 9):
            update(done, None, f"f{done}.py")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("long ... ") and len(lines) >= 2
    assert lines[-1] == "long ... 8 (f8.py)"

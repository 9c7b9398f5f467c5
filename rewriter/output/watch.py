"""``deepstack-patch watch`` as text: a table per patch, then the diffs to read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepstack_patch.output.plain import escape

if TYPE_CHECKING:
    from rich.console import Console

_STYLE = {"carried": "green", "known": "cyan", "new": "bold yellow"}


def print_watch(console: Console, result: Any, all_diffs: bool = False) -> None:
    """``result`` is a ``distribution.watch.WatchResult``."""
    first, last = result.releases[0], result.releases[-1]
    console.print(
        f"watch: {len(result.releases)} releases, {first} to {last} "
        f"({', '.join(result.releases)})"
    )
    for patch_id in result.patch_ids:
        sizes = result.sizes[patch_id]
        changes = [c for c in result.changes if c.patch_id == patch_id]
        console.print()
        console.print(
            f"[bold]{escape(patch_id)}[/]  footprint: "
            f"{sizes.get(first, 0)} units on {first}, "
            f"{sizes.get(last, 0)} on {last}"
        )
        if not changes:
            console.print(f"  no footprint unit changed from {first} to {last}")
            continue
        for change in changes:
            style = _STYLE[change.classification]
            line = (
                f"  {change.previous} -> {change.release}  "
                f"[{style}]{change.classification:<7}[/]  "
                f"{escape(change.symbol)} ({change.kind})  "
                f"{escape(change.path)}:{change.line}"
            )
            console.print(line)
            console.print(f"      why watched: {escape(change.why)}")
            if change.carried_by:
                console.print(f"      written by: {', '.join(change.carried_by)}")
            if change.reason:
                console.print(f"      reviewed: {escape(change.reason)}")
            if change.series_rewrites:
                console.print(
                    "      the series rewrites this function too, but upstream's "
                    "change is more than the series writes"
                )
            for commit in change.commits:
                pr = f" #{commit.pull_request}" if commit.pull_request else ""
                console.print(
                    f"      commit {commit.sha[:12]}{pr}: {escape(commit.subject)}"
                )
    shown = [c for c in result.changes if all_diffs or c.classification == "new"]
    for change in shown:
        console.print()
        console.print(
            f"[bold]{escape(change.patch_id)} {change.release} "
            f"{escape(change.symbol)} ({change.classification})[/]"
        )
        console.print(escape(change.diff.rstrip("\n")), soft_wrap=True)
    counts = {n: sum(c.classification == n for c in result.changes) for n in _STYLE}
    console.print()
    console.print(
        f"{len(result.changes)} changes: {counts['carried']} carried, "
        f"{counts['known']} known, {counts['new']} new"
        + (f" ({where_to_record(result)})" if counts["new"] else "")
    )


def where_to_record(result: Any) -> str:
    """Where a reviewed change goes: the file given with --reviewed, never
    the watch.toml shipped with the tool (an upgrade replaces it)."""
    if result.reviewed_shipped:
        return (
            "review them; record harmless ones in a TOML file of your own and "
            "give it with --reviewed FILE (docs/watch.md shows an entry)"
        )
    return f"review them; record harmless ones in {result.reviewed_file}"


def print_footprints(console: Console, tree: Any, found: Any) -> None:
    """``list --footprint``: per patch, each function with file:line and why."""
    console.print(f"footprints in vLLM {tree.version} at {escape(str(tree.root))}")
    for item in found:
        console.print()
        console.print(
            f"[bold]{escape(item.patch_id)}[/]  {unit_counts(item.functions)}"
        )
        for function in item.functions:
            kind = "" if function.kind == "function" else f"{function.kind} "
            console.print(
                f"  {kind}{escape(function.symbol)}  "
                f"{escape(function.path)}:{function.line}  ({escape(function.why)})"
            )


def unit_counts(units: Any) -> str:
    """``2 functions``, ``1 function, 1 statement``: a footprint's size by
    kind (a derived patch's class attributes are statements)."""
    counts: dict[str, int] = {}
    for unit in units:
        counts[unit.kind] = counts.get(unit.kind, 0) + 1
    if not counts:
        return "0 functions"
    return ", ".join(
        f"{n} {kind}{'' if n == 1 else 'es' if kind == 'class' else 's'}"
        for kind, n in sorted(counts.items(), key=lambda pair: pair[0] != "function")
    )

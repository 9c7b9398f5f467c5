"""The series a command runs: the built-in patches, those of installed
entry points and those of its ``--patches`` folders (:func:`load_series`,
the one place the command line imports patches), and the options that
choose them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from deepstack_patch.output.progress import warn

if TYPE_CHECKING:
    from deepstack_patch.engine.protocol import Patch
    from deepstack_patch.engine.series import FolderAgreement


#: Where ``patches_option`` keeps the ``--patches`` folders of the command.
PATCHES_META = "deepstack_patch.patches_folders"
#: Where :func:`load_series` keeps the agreement checks it left running.
AGREEMENT_META = "deepstack_patch.agreement"
#: The commands whose data files' agreement is told once their plan is made
#: (:func:`told_agreement`), while it is worked out on another core: a first
#: ``status`` of 40 derived fixes spent 0.2 s of its first second on it,
#: on the one core the plan and ty start on.
AGREED_LATER = frozenset({"status"})


def load_series(
    folders: Sequence[Path] | None = None, agreed_later: bool = False
) -> Sequence[Patch]:
    """The patch series: the built-in one, then the patches of installed entry
    points, then those of the ``--patches`` folders in the order given (by
    default the current command's). The one place the command line imports
    the patches; every layer below gets the series as an argument.

    With ``agreed_later``, whether the folders' data files agree is worked
    out while the command goes on, and told by :func:`told_agreement`
    (which the command calls before it reports or writes anything)."""
    context = click.get_current_context(silent=True)
    meta = context.meta if context is not None else {}
    if folders is None:
        folders = meta.get(PATCHES_META, ())
    # One folder given twice (or by two names) is one folder: its patches
    # join once, rather than colliding with themselves.
    unique: dict[Path, Path] = {}
    for folder in folders:
        unique.setdefault(Path(folder).resolve(), Path(folder))
    folders = [*unique.values()]
    key = (PATCHES_META, tuple(folders))
    if key not in meta:  # once per command: a module runs once
        from deepstack_patch.engine.series import (
            assemble_series,
            patches_from_entry_points,
            patches_from_folder,
        )
        from deepstack_patch.patches import SERIES

        extra = patches_from_entry_points()
        ahead: list[FolderAgreement] | None = [] if agreed_later else None
        if ahead is not None and context is not None:
            meta[AGREEMENT_META] = ahead
            context.call_on_close(lambda: [each.stop() for each in ahead])
        for folder in folders:
            extra.extend(patches_from_folder(folder, ahead=ahead))
        meta[key] = assemble_series(SERIES, extra) if extra else SERIES
        warn_same_changes(meta[key])
    return meta[key]


def told_agreement() -> None:
    """Raise the first data file that disagrees (as loading would have) of
    a series loaded ``agreed_later`` (:func:`load_series`); nothing where
    each agrees, was told already, or the series was checked as it loaded."""
    context = click.get_current_context(silent=True)
    for each in context.meta.get(AGREEMENT_META, ()) if context is not None else ():
        each.refuse()


def warn_same_changes(series: Sequence[Patch]) -> None:
    """Two derived patches of one change: the second reads ``applied`` once
    the first is, and would say nothing of it."""
    from deepstack_patch.engine.series import same_changes

    for first, second in same_changes(series):
        warn(
            f"{first.id} and {second.id} make the same change ({first.origin}; "
            f"{second.origin}): once one is applied the other reads applied; "
            f"keep one of them (or --skip {second.id})"
        )


def patches_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--patches DIR`` (repeatable): patches from elsewhere join the series
    that :func:`load_series` gives this command.

    The folder is checked by :func:`load_series` (``error:``/``hint:``), not
    by click, whose "Invalid value" has neither; its help names ``--only`` and
    ``--skip`` only on a command that has them.
    """
    if command.__name__ == "derive":
        what_then = " Repeatable; the derived patch's id must be new to them."
    elif "only" in inspect.signature(command).parameters:
        what_then = " Repeatable; select them by id with --only/--skip."
    else:
        what_then = " Repeatable."

    @click.option(
        "--patches",
        "patches_folders",
        multiple=True,
        metavar="DIR",
        type=click.Path(path_type=Path),
        help="Add the patches of this folder to the series, after the built-in "
        "ones and those of installed packages (entry-point group "
        "deepstack_patch.patches): derived patches (*.toml, from `derive`) and "
        "patch modules (*.py defining PATCH or PATCHES)." + what_then,
    )
    @functools.wraps(command)
    def wrapper(patches_folders: tuple[Path, ...], **kwargs: Any) -> Any:
        click.get_current_context().meta[PATCHES_META] = patches_folders
        # A bad folder is refused before a release is fetched.
        load_series(agreed_later=command.__name__ in AGREED_LATER)
        return command(**kwargs)

    return wrapper


def select_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--skip", multiple=True, metavar="ID", help="Leave this patch out (repeatable)."
    )(command)
    return click.option(
        "--only", multiple=True, metavar="ID", help="Only this patch (repeatable)."
    )(command)

"""Patches from elsewhere, and the series they join.

The built-in series is what this tool ships. A distributor adds patches of
its own in two ways:

- a folder given with ``--patches DIR``: each ``*.toml`` in it is a derived
  patch (the data file `deepstack-patch derive` writes), each ``*.py`` a
  hand-written patch module defining ``PATCH`` (a :class:`Patch`) or
  ``PATCHES`` (a sequence of them); files whose name starts with ``_`` are
  left alone (a module is loaded by itself, not as part of a package);
- an installed package with an entry point in the group
  :data:`ENTRY_POINT_GROUP`, which loads to a patch, a sequence of patches, a
  callable returning them, or the path of a folder as above.

:func:`assemble_series` puts them after the built-in series, in the order
given, each after the patches its ``requires`` names; an id already in the
series is an error naming both origins. Every patch says where it came from
(``Patch.origin``), and :func:`patch_sources` tells a process that runs
apart (the proof runner) how to load the same patches again;
:func:`series_segments` cuts the series where the plan must finish the
earlier patches, in every file, before the next (a derived one). Nothing
here names a fix.
"""

from __future__ import annotations

import copyreg
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.protocol import Patch

if TYPE_CHECKING:
    from deepstack_patch.engine.derived.truth import Agreement, AgreementAhead

#: The entry-point group a vendor's package of patches declares.
ENTRY_POINT_GROUP = "deepstack_patch.patches"

BUILT_IN = "built-in"

FOLDER_HINT = (
    "a --patches folder holds derived patches (*.toml, written by "
    "`deepstack-patch derive`) and patch modules (*.py defining PATCH or PATCHES)"
)

#: How another process loads a patch again, by its origin (see patch_sources).
_SOURCES: dict[str, dict[str, str]] = {}

#: Patch modules already loaded in this process, by absolute path.
_MODULES: dict[Path, list[Patch]] = {}


def patches_from_folder(
    folder: Path,
    given_by: str = "--patches",
    ahead: list[FolderAgreement] | None = None,
) -> list[Patch]:
    """The patches of a ``--patches`` folder, in the order of their file names.

    ``given_by`` says where the folder was named (an entry point's errors
    say it themselves: ``""``). Given ``ahead``, whether the data files'
    units agree is worked out while the command goes on, and told when it
    asks (:class:`FolderAgreement`, appended there); else now.
    """
    folder = Path(folder)
    # The folder is the error's place (path=): the message does not repeat it.
    said = f" (given with {given_by})" if given_by else ""
    if not folder.exists():
        raise DeepstackError(
            f"no such folder{said}",
            "check the path; " + FOLDER_HINT + ", such as the folder "
            "`derive --out` wrote",
            path=str(folder),
        )
    if not folder.is_dir():
        raise DeepstackError(
            f"not a folder{said}",
            f"give the folder that holds it: --patches {folder.absolute().parent} "
            "(every patch in it joins the series)"
            if given_by == "--patches"
            else FOLDER_HINT,
            path=str(folder),
        )
    files = sorted(
        path
        for path in folder.iterdir()
        if path.suffix in (".toml", ".py")
        and not path.name.startswith("_")
        and path.is_file()
    )
    # Whether each data file's units agree is checked for all at once, and
    # told in the files' order (an earlier one's before a later one's error).
    agreement: list[Agreement] = []
    patches: list[Patch] = []
    for path in files:
        try:
            patches += _from_folder_file(path, agreement)
        except DeepstackError:
            _refuse_disagreements(files, agreement)
            raise
    if not patches:
        _refuse_disagreements(files, agreement)
        raise DeepstackError(
            f"the folder holds no patch{said}",
            FOLDER_HINT + "; give the folder `derive --out` wrote",
            path=str(folder),
        )
    if ahead is None:
        _refuse_disagreements(files, agreement)
    elif agreement:
        from deepstack_patch.engine.derived.truth import agreement_ahead

        ahead.append(FolderAgreement(files, agreement_ahead(agreement)))
    return patches


class FolderAgreement:
    """Whether a folder's data files agree (:mod:`.derived.truth`), worked out
    while the command goes on: :meth:`refuse` tells it as loading would
    have, the folder's broken file named."""

    def __init__(self, files: Sequence[Path], checking: AgreementAhead) -> None:
        self.files, self._checking = files, checking

    def refuse(self) -> None:
        try:
            self._checking.refuse()
        except DeepstackError as exc:
            raise _named(self.files, exc) from exc

    def stop(self) -> None:
        self._checking.stop()


def _from_folder_file(path: Path, agreement: list[Agreement]) -> list[Patch]:
    """:func:`patches_from_file` of one file of a folder. One broken file
    stops the command (a batch that silently lost a fix would be applied
    as if whole), so its error names it and says how to go on without it."""
    try:
        return patches_from_file(path, agreement)
    except DeepstackError as exc:
        raise _left_out(path, exc) from exc


def _refuse_disagreements(files: Sequence[Path], agreement: list[Agreement]) -> None:
    """The first data file of ``agreement`` whose units disagree, told as
    the folder's broken file (:func:`_from_folder_file`)."""
    if not agreement:
        return
    from deepstack_patch.engine.derived.truth import refuse_disagreements

    try:
        refuse_disagreements(agreement)
    except DeepstackError as exc:
        raise _named(files, exc) from exc


def _named(files: Sequence[Path], exc: DeepstackError) -> DeepstackError:
    """A data file's disagreement told as the folder's broken file."""
    told = Path(str(exc.path)).absolute()
    (path,) = [path for path in files if path.absolute() == told]
    return _left_out(path, exc)


def _left_out(path: Path, exc: DeepstackError) -> DeepstackError:
    """``exc``, an error of the folder's file ``path``, naming it, with the
    way to go on without it."""
    own = exc.path is not None and Path(exc.path).absolute() == path.absolute()
    message = exc.message if own else f"{exc.message} (loading {path})"
    folder = path.absolute().parent
    leave_out = (
        f"to go on without it, rename it to _{path.name} (a file whose "
        f"name starts with _ is not read) or move it out of {folder}"
    )
    return DeepstackError(
        message,
        f"{exc.hint}; {leave_out}" if exc.hint else leave_out,
        path=exc.path if exc.path is not None else str(path),
        line=exc.line,
    )


def patches_from_file(
    path: Path, agreement: list[Agreement] | None = None
) -> list[Patch]:
    """The patches of one data file or patch module, each with its origin
    (``agreement``: see :func:`.derived.load_derived`)."""
    path = Path(path).absolute()
    if path.suffix == ".toml":
        patches = [_load_data_file(path, agreement)]
    else:
        patches = _load_module_file(path)
    for patch in patches:
        _set_origin(patch, str(path), {"file": str(path)})
    return patches


def _load_data_file(path: Path, agreement: list[Agreement] | None) -> Patch:
    try:
        from deepstack_patch.engine.derived import load_derived
    except ImportError as exc:
        raise DeepstackError(
            f"cannot read the derived patch {path}: this deepstack-patch has no "
            f"derived patches ({exc})",
            "install a deepstack-patch that has `derive`, or remove the data "
            "file from the folder",
            path=str(path),
        ) from exc
    try:
        patch = load_derived(path, agreement)
    except DeepstackError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken file is the user's to fix
        raise DeepstackError(
            f"broken derived patch: {type(exc).__name__}: {exc}",
            "write it again with `deepstack-patch derive`, or remove it from "
            "the folder",
            path=str(path),
            line=getattr(exc, "lineno", None),
        ) from exc
    return _checked(patch, str(path), "load_derived")


def _load_module_file(path: Path) -> list[Patch]:
    if path in _MODULES:
        return _MODULES[path]
    import hashlib  # only here: loading OpenSSL costs a command that has none

    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"_deepstack_patches_{digest}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DeepstackError(
            "not a Python module", FOLDER_HINT, path=str(path)
        )  # pragma: no cover - a *.py file always has a spec
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look it up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken module is the user's to fix
        del sys.modules[name]
        where, line = _failing_line(exc, path)
        raise DeepstackError(
            f"broken patch module: {type(exc).__name__}: {exc}",
            f"fix {where}:{line} (where loading it failed), or remove the module "
            "from the folder",
            path=where,
            line=line,
        ) from exc
    found = _declared(module, path)
    for patch in found:
        # A process started by `spawn` (matrix) unpickles the patch by loading
        # its module from the file again: the module's name means nothing there.
        copyreg.pickle(type(patch), _reduce_file_patch)
    _MODULES[path] = found
    return found


def _declared(module: Any, path: Path) -> list[Patch]:
    """``PATCH`` or ``PATCHES`` of a patch module."""
    match getattr(module, "PATCH", None), getattr(module, "PATCHES", None):
        case None, None:
            raise DeepstackError(
                "the module defines neither PATCH nor PATCHES",
                "end it with `PATCH = YourPatch()` (or `PATCHES = [...]`); name a "
                "helper module _name.py so that it is not read as a patch",
                path=str(path),
            )
        case patch, None:
            return [_checked(patch, str(path), "PATCH")]
        case None, (list() | tuple()) as patches if patches:
            return [_checked(p, str(path), "PATCHES") for p in patches]
        case None, other:
            raise DeepstackError(
                f"PATCHES is {_describe(other)}, not a non-empty list of patches",
                "write `PATCHES = [FirstPatch(), SecondPatch()]`",
                path=str(path),
            )
        case _:
            raise DeepstackError(
                "the module defines both PATCH and PATCHES",
                "keep one: PATCH for one patch, PATCHES for several",
                path=str(path),
            )


#: Class-level metadata every patch must have (see ``Patch``).
_REQUIRED = ("id", "title", "paths", "markers", "parts")


def _checked(obj: object, where: str, name: str) -> Patch:
    """``obj`` if it is a patch with the metadata the engine reads, else an error."""
    match obj:
        case type() if issubclass(obj, Patch):
            raise DeepstackError(
                f"{name} is the class {obj.__name__}, not a patch",
                f"use an instance: {name} = {obj.__name__}()",
                path=where,
            )
        case Patch():
            pass
        case _:
            raise DeepstackError(
                f"{name} is {_describe(obj)}, not a Patch",
                "a patch is an instance of a subclass of "
                "deepstack_patch.engine.protocol.Patch",
                path=where,
            )
    missing = [attribute for attribute in _REQUIRED if not hasattr(obj, attribute)]
    if missing:
        raise DeepstackError(
            f"{type(obj).__name__} lacks {', '.join(missing)}",
            "a patch declares id, title, paths, markers and parts "
            "(docs/adding-a-patch.md)",
            path=where,
        )
    patch_id = obj.id
    if not isinstance(patch_id, str) or not patch_id or patch_id.split() != [patch_id]:
        raise DeepstackError(
            f"{type(obj).__name__}.id is {patch_id!r}: a patch id is short text "
            "without spaces",
            "e.g. id = 'acme#12'",
            path=where,
        )
    return obj


def _describe(obj: object) -> str:
    return f"a {type(obj).__name__} ({obj!r:.60})"


def _failing_line(exc: BaseException, path: Path) -> tuple[str, int | None]:
    """Where loading failed: the syntax error's line, else the last line of
    the traceback in the module itself, else the deepest one."""
    import traceback

    if isinstance(exc, SyntaxError) and exc.filename:
        return exc.filename, exc.lineno
    frames = traceback.extract_tb(exc.__traceback__)
    own = [frame for frame in frames if Path(frame.filename) == path]
    frame = (own or frames or [None])[-1]
    if frame is None:
        return str(path), None
    return frame.filename, frame.lineno


def _reduce_file_patch(
    patch: Patch,
) -> tuple[Callable[..., Patch], tuple[str, str, str]]:
    path = patch_file(patch) or patch.origin
    return patch_from_file, (str(path), patch.id, patch.origin)


def patch_from_file(path: str, patch_id: str, origin: str = "") -> Patch:
    """The patch ``patch_id`` of a data file or patch module (unpickling)."""
    for patch in patches_from_file(Path(path)):
        if patch.id == patch_id:
            if origin:
                _set_origin(patch, origin, {"file": path})
            return patch
    raise DeepstackError(
        f"{path} no longer holds the patch {patch_id}",
        "the file changed while the command ran: run the command again",
        path=path,
    )


def _set_origin(patch: Patch, origin: str, source: dict[str, str]) -> None:
    patch.origin = origin
    _SOURCES[origin] = source


def patches_from_entry_points() -> list[Patch]:
    """The patches of every installed entry point of :data:`ENTRY_POINT_GROUP`,
    by entry-point name."""
    from importlib.metadata import entry_points

    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    return [patch for ep in found for patch in _entry_point_patches(ep)]


def _entry_point_patches(ep: Any) -> list[Patch]:
    dist = getattr(ep, "dist", None)
    package = f"{dist.name} {dist.version}" if dist is not None else "unknown package"
    origin = f"entry point {ep.name} ({package})"
    hint = (
        f"fix the entry point {ep.name} = {ep.value} of {package}, or uninstall "
        f"that package (group {ENTRY_POINT_GROUP})"
    )
    try:
        loaded = ep.load()
    except Exception as exc:  # noqa: BLE001 - a broken package is the user's to fix
        import traceback

        frames = traceback.extract_tb(exc.__traceback__)
        where = (exc.filename, exc.lineno) if isinstance(exc, SyntaxError) else None
        if where is None and frames:
            where = (frames[-1].filename, frames[-1].lineno)
        raise DeepstackError(
            f"{origin} = {ep.value} could not be loaded: {type(exc).__name__}: {exc}",
            hint,
            path=where[0] if where else None,
            line=where[1] if where else None,
        ) from exc
    try:
        patches = resolve_loaded(loaded, origin)
    except DeepstackError as exc:
        path = exc.path if exc.path and Path(exc.path).exists() else None
        message = exc.message
        if not message.startswith(origin):
            message = f"{origin}: {message}"
        raise DeepstackError(message, exc.hint or hint, path=path) from exc
    source = _entry_point_source(ep, origin)
    for patch in patches:
        if not _from_its_folder(patch, origin):
            _set_origin(patch, origin, source)
    return patches


def _from_its_folder(patch: Patch, origin: str) -> bool:
    """The patch was read from a folder the entry point named (its origin
    then says which file)."""
    return patch.origin.startswith(f"{origin}: ")


def resolve_loaded(loaded: object, origin: str) -> list[Patch]:
    """What an entry point loads to, as patches: a patch, a sequence of
    patches, a callable returning either, or the path of a folder."""
    match loaded:
        case Patch():
            return [_checked(loaded, origin, origin)]
        case str() | os.PathLike():
            patches = patches_from_folder(Path(loaded), given_by="")
            for patch in patches:
                path = patch.origin  # the file's (patches_from_file)
                _set_origin(patch, f"{origin}: {path}", {"file": path})
            return patches
        case type():
            return [_checked(loaded, origin, origin)]  # the error of a class
        case list() | tuple():
            if not loaded:
                raise DeepstackError(
                    f"{origin} gives no patch",
                    "the package's entry point must name a Patch, a sequence of "
                    "them, a callable returning them, or a folder of patch files",
                )
            return [_checked(item, origin, origin) for item in loaded]
        case _ if callable(loaded):
            try:
                result = loaded()
            except Exception as exc:  # noqa: BLE001 - the package's to fix
                raise DeepstackError(
                    f"{origin}: calling it failed: {type(exc).__name__}: {exc}",
                    "fix or uninstall the package that declares this "
                    "deepstack_patch.patches entry point",
                ) from exc
            if callable(result) and not isinstance(result, Patch):
                raise DeepstackError(
                    f"{origin} returned {_describe(result)}",
                    "the callable must return a Patch, a sequence of them, or a "
                    "folder of patch files",
                )
            return resolve_loaded(result, origin)
    return [_checked(loaded, origin, origin)]


def _entry_point_source(ep: Any, origin: str) -> dict[str, str]:
    """How the proof runner loads the entry point without its package
    installed there: the top-level package's folder (or module file)."""
    top = ep.value.partition(":")[0].strip().split(".")[0]
    module = sys.modules.get(top)
    spec = getattr(module, "__spec__", None)
    source = {"origin": origin, "value": ep.value, "top": top}
    if spec is not None and spec.submodule_search_locations:
        source["package_dir"] = str(next(iter(spec.submodule_search_locations)))
    elif spec is not None and spec.origin:
        source["module_file"] = spec.origin
    return source


def patch_file(patch: Patch) -> Path | None:
    """The data file or module a patch was read from, if it came from one."""
    source = _SOURCES.get(patch.origin, {})
    return Path(source["file"]) if "file" in source else None


def patch_sources(patches: Sequence[Patch]) -> list[dict[str, str]]:
    """How a process that runs apart loads ``patches`` again (the built-in
    ones need nothing): JSON-able, one entry per file or entry point."""
    sources = []
    for patch in patches:
        source = _SOURCES.get(patch.origin)
        if patch.origin != BUILT_IN and source and source not in sources:
            sources.append(source)
    return sources


def load_sources(sources: Sequence[dict[str, str]]) -> list[Patch]:
    """The patches of :func:`patch_sources`' entries, in another process.

    An entry point's package need not be installed there: its top-level
    package is loaded from the folder it was found in.
    """
    patches: list[Patch] = []
    for source in sources:
        if "file" in source:
            patches.extend(patches_from_file(Path(source["file"])))
            continue
        top = source["top"]
        if top not in sys.modules:
            folder = source.get("package_dir")
            location = Path(folder) / "__init__.py" if folder else source["module_file"]
            spec = importlib.util.spec_from_file_location(
                top, location, submodule_search_locations=[folder] if folder else None
            )
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[top] = module
            spec.loader.exec_module(module)
        module_name, _, attribute = source["value"].partition(":")
        loaded: Any = importlib.import_module(module_name.strip())
        for part in attribute.strip().split(".") if attribute.strip() else []:
            loaded = getattr(loaded, part)
        for patch in resolve_loaded(loaded, source["origin"]):
            if not _from_its_folder(patch, source["origin"]):
                patch.origin = source["origin"]
            patches.append(patch)
    return patches


def assemble_series(
    builtin: Sequence[Patch], extra: Sequence[Patch]
) -> tuple[Patch, ...]:
    """The built-in series, then ``extra`` in the order given, each after the
    patches its ``requires`` names.

    An id already in the series is an error naming both origins; so is a
    ``requires`` or a companion that names no patch of the series, and a
    cycle of requirements.
    """
    origins = {patch.id: patch.origin for patch in builtin}
    by_id: dict[str, Patch] = {}
    for patch in extra:
        if patch.id in origins:
            raise DeepstackError(
                f"patch id {patch.id!r} of {patch.origin} is already in the "
                f"series, from {origins[patch.id]}",
                "give each patch its own id (`derive --id`), or leave one of "
                "them out of the --patches folders",
                path=_path_of(patch),
            )
        origins[patch.id] = patch.origin
        by_id[patch.id] = patch
    for patch in extra:
        for kind, named in (
            ("requires", patch.requires),
            ("companions", patch.companions),
        ):
            unknown = [patch_id for patch_id in named if patch_id not in origins]
            if unknown:
                raise DeepstackError(
                    f"patch {patch.id} ({patch.origin}) {kind} "
                    f"{', '.join(unknown)}, which is not in the series",
                    f"add the folder that holds {', '.join(unknown)} with "
                    "--patches, or install it (see `deepstack-patch list`)",
                    path=_path_of(patch),
                )
    ordered: list[Patch] = list(builtin)
    placed = {patch.id for patch in builtin}

    def place(patch: Patch, waiting: tuple[str, ...]) -> None:
        if patch.id in placed:
            return
        if patch.id in waiting:
            cycle = " -> ".join([*waiting, patch.id])
            raise DeepstackError(
                f"the patches require each other: {cycle}",
                "remove one of these requires",
                path=_path_of(patch),
            )
        for required in patch.requires:
            if required in by_id:
                place(by_id[required], (*waiting, patch.id))
        ordered.append(patch)
        placed.add(patch.id)

    for patch in extra:
        place(patch, ())
    return tuple(ordered)


def same_changes(series: Sequence[Patch]) -> list[tuple[Patch, Patch]]:
    """Derived patches that make one change under two ids (the same units
    with the same edits), each with the first that makes it.

    Both are in the series, and once one is applied the other reads
    ``applied``: nothing says that the second was never needed.
    """
    # Never imported here: no derived patch exists unless its module is loaded.
    derived = sys.modules.get("deepstack_patch.engine.derived")
    if derived is None:
        return []
    first_with: dict[frozenset[Any], Patch] = {}
    pairs = []
    for patch in series:
        if not isinstance(patch, derived.DerivedPatch):
            continue
        change = frozenset(
            (unit.path, unit.kind, unit.name, unit.edits) for unit in patch.units
        )
        if change in first_with:
            pairs.append((first_with[change], patch))
        else:
            first_with[change] = patch
    return pairs


def _path_of(patch: Patch) -> str | None:
    found = patch_file(patch)
    return str(found) if found else None


def series_segments(series: Sequence[Patch]) -> list[list[Patch]]:
    """The series cut before every patch that reads other files of the tree
    than its own (``reads_tree``: a derived patch), so that it is planned
    after every earlier patch, in all files: the built-in series, which
    reads no other file, stays one segment."""
    segments: list[list[Patch]] = [[]]
    for patch in series:
        if getattr(patch, "reads_tree", False) and segments[-1]:
            segments.append([])
        segments[-1].append(patch)
    return [segment for segment in segments if segment]

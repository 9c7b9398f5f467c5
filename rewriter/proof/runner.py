"""Run patches' proofs on one tree; executed as a script by the proof environment.

`deepstack-patch verify` starts this file with the proof environment's
interpreter (which need not have deepstack-patch installed), as::

    python runner.py REQUEST.json

The request names the tree, the patch ids, where ``deepstack_patch`` and
``deepstack_patch.patches`` live, where the patches from elsewhere are (a
``--patches`` folder's files, entry points), and where to write the results. The tree
goes first on ``sys.path``, so ``import vllm`` is the tree's. All proofs of a
tree share one process because importing vLLM takes seconds. Standard library
only until the packages are loaded from the request's folders.

A request with ``modules`` instead imports those modules of the tree, one
after another, and writes each one's error (``""``: it imported): verify's
import stage (``imports.py``). Nothing of deepstack-patch is loaded for it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import time
import traceback
from pathlib import Path


def load_package(name: str, folder: str) -> None:
    """Import package ``name`` from ``folder`` whatever the install layout.

    The project maps ``rewriter/`` to ``deepstack_patch``, so an editable
    install has no ``deepstack_patch`` folder a ``sys.path`` entry could find.
    """
    spec = importlib.util.spec_from_file_location(
        name, Path(folder) / "__init__.py", submodule_search_locations=[folder]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def patches_dir() -> Path:
    """Where ``deepstack_patch.patches`` lives, found without importing it.

    The one place outside the command line that knows the series' package:
    the runner loads it by name in its own process.
    """
    spec = importlib.util.find_spec("deepstack_patch.patches")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def install_code_cache(tree: Path) -> None:
    """Compiled code of the tree's modules from the cache (``code_cache.py``)."""
    path = Path(__file__).with_name("code_cache.py")
    spec = importlib.util.spec_from_file_location("_code_cache", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install_from_environment(tree)


def patch_by_id(patch_id: str, sources: list[dict]) -> object:
    """The built-in patch, or one of the patches from elsewhere that verify
    named in ``sources`` (a ``--patches`` folder's file, an entry point whose
    package this environment need not have installed)."""
    from deepstack_patch.patches import SERIES

    for patch in SERIES:
        if patch.id == patch_id:
            return patch
    if sources:
        from deepstack_patch.engine.series import load_sources

        for patch in load_sources(sources):
            if patch.id == patch_id:
                return patch
    raise KeyError(patch_id)


def run(request: dict) -> list[dict]:
    tree = Path(request["tree"])
    sys.path.insert(0, str(tree))
    install_code_cache(tree)
    load_package("deepstack_patch", request["package_dir"])
    load_package("deepstack_patch.patches", request["patches_dir"])

    results = []
    for patch_id in request["patch_ids"]:
        patch = patch_by_id(patch_id, request.get("sources", []))
        print(f"proof {patch_id} on {tree}", file=sys.stderr, flush=True)
        started = time.monotonic()
        # Each proof's own stderr (its notes) is kept with its verdict.
        log = io.StringIO()
        try:
            with contextlib.redirect_stderr(log):
                patch.prove(tree)
            status, message = "passed", ""
        except AssertionError as exc:
            # The proof's own verdict: the fix's behaviour is absent.
            status, message = "failed", str(exc) or traceback.format_exc(limit=-3)
        except Exception as exc:
            # Anything else is a proof that could not judge (import error, ...).
            status = "error"
            message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        results.append(
            {
                "id": patch_id,
                "status": status,
                "message": message,
                "seconds": round(time.monotonic() - started, 2),
                "log": log.getvalue(),
            }
        )
        # Written after each proof, so a crash later keeps the verdicts so far.
        Path(request["output"]).write_text(json.dumps(results))
    return results


def import_modules(request: dict) -> list[dict]:
    """Import each of ``request["modules"]`` from the tree; its error, if any."""
    import importlib

    tree = Path(request["tree"])
    sys.path.insert(0, str(tree))
    install_code_cache(tree)
    results = []
    for module in request["modules"]:
        print(f"import {module} from {tree}", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            importlib.import_module(module)
            error = ""
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a module may raise anything, exit too
            error = import_error(exc, tree, module)
        results.append(
            {
                "module": module,
                "error": error,
                "seconds": round(time.monotonic() - started, 2),
            }
        )
        Path(request["output"]).write_text(json.dumps(results))
    return results


def import_error(exc: BaseException, tree: Path, module: str) -> str:
    """``ImportError: cannot import name ...``, and where in the tree it was
    raised: the last line of the module's own file on the way, else the
    last line of the tree's files."""
    own = {module.replace(".", "/") + ".py", module.replace(".", "/") + "/__init__.py"}
    in_tree, in_module = "", ""
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            relative = Path(frame.filename).resolve().relative_to(tree.resolve())
        except ValueError:
            continue
        in_tree = f"{relative.as_posix()}:{frame.lineno}"
        if relative.as_posix() in own:
            in_module = in_tree
    where = in_module or in_tree
    return f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")


if __name__ == "__main__":
    request = json.loads(Path(sys.argv[1]).read_text())
    if "modules" in request:
        import_modules(request)
    else:
        run(request)

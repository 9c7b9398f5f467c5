"""What the import system of a Python would load for vLLM: a standalone script.

``doctor`` runs this file's source with ``PY -c`` in the interpreter it
examines, which need not have deepstack-patch installed: so the standard
library only, and code that older Pythons (3.8) still run. It reads a JSON
request on stdin and prints a JSON answer. Nothing here imports vLLM unless
the request says ``"import": true``.

Requests: ``{"ask": "where"}`` (which vllm, its distribution, the path),
``{"ask": "modules", "root": R, "files": [...]}`` (for each target file: the
file its module would load from and the state of its bytecode), and
``{"ask": "import", "root": R, "functions": [[relpath, qualname], ...]}``
(import the modules and compare each live function with the source's code).

The live check in every vLLM process (:mod:`.live_plugin`) imports
:func:`bytecode_state` from here as a module.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import marshal
import os
import sys

#: States of the bytecode the interpreter would use for a source file. Only
#: "stale" means the old code runs; "recompiled" pycs are outdated but the
#: interpreter notices and compiles the source instead.
FRESH, ABSENT, RECOMPILED, STALE = "fresh", "none", "recompiled", "stale"


def bytecode_state(source_path, thorough=True):
    """(pyc path, state, why) for the bytecode an import of ``source_path``
    would use, by the rules of importlib's SourceLoader."""
    try:
        pyc = importlib.util.cache_from_source(source_path)
    except NotImplementedError:  # sys.implementation.cache_tag is None
        return None, ABSENT, "this Python writes no bytecode cache"
    try:
        with open(pyc, "rb") as handle:
            data = handle.read()
    except OSError:
        return pyc, ABSENT, "no bytecode: the source is compiled on import"
    if data[:4] != importlib.util.MAGIC_NUMBER or len(data) < 16:
        return pyc, RECOMPILED, "bytecode of another Python: ignored"
    flags = int.from_bytes(data[4:8], "little")
    if flags & ~0b11:
        return pyc, RECOMPILED, "invalid bytecode flags: ignored"
    if flags & 0b1:  # hash-based (PEP 552)
        mode = _check_hash_mode()
        checked = mode == "always" or (flags & 0b10 and mode != "never")
        with open(source_path, "rb") as handle:
            source = handle.read()
        matches = data[8:16] == importlib.util.source_hash(source)
        if matches:
            return pyc, FRESH, "source hash matches"
        if checked:
            return pyc, RECOMPILED, "checked-hash bytecode of other source: ignored"
        return (
            pyc,
            STALE,
            (
                "unchecked-hash bytecode of other source: the interpreter runs it "
                "without reading the source"
            ),
        )
    stat = os.stat(source_path)
    mtime = int(stat.st_mtime) & 0xFFFFFFFF
    size = stat.st_size & 0xFFFFFFFF
    header = (
        int.from_bytes(data[8:12], "little"),
        int.from_bytes(data[12:16], "little"),
    )
    if header != (mtime, size):
        return pyc, RECOMPILED, "timestamp bytecode older than the source: ignored"
    if not thorough:
        return pyc, FRESH, "timestamp and size match"
    # Same mtime and size can still hold other code (a copy that kept the
    # mtime); code objects compare everything but the file name.
    try:
        with open(source_path, "rb") as handle:
            source = handle.read()
        code = marshal.loads(data[16:])
        fresh = code == compile(
            source, source_path, "exec", dont_inherit=True, optimize=sys.flags.optimize
        )
    except (OSError, ValueError, EOFError, TypeError, SyntaxError):
        fresh = False
    if fresh:
        return pyc, FRESH, "timestamp and size match; same code"
    return pyc, STALE, "timestamp and size match, but the bytecode holds other code"


def _check_hash_mode():
    try:
        import _imp

        return _imp.check_hash_based_pycs
    except (ImportError, AttributeError):
        return "default"


def _where(request):
    here = os.path.abspath(os.getcwd())
    # `python -c` put the working folder first ("" ); a console script
    # (`vllm serve`) does not see it, only `python -m` does: report it apart,
    # never let it decide. A PYTHONPATH entry naming that folder stays.
    path = sys.path[1:] if sys.path[:1] == [""] else list(sys.path)
    sys.path[:] = path
    pythonpath = [
        os.path.abspath(p)
        for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p
    ]
    spec = importlib.util.find_spec("vllm")
    found = None
    if spec is not None:
        found = {
            "origin": spec.origin,
            "locations": list(spec.submodule_search_locations or []),
        }
    candidates = []
    on_path = [os.path.abspath(p or here) for p in path]
    extra = [] if here in on_path else [here]
    for entry in extra + path:
        package = os.path.join(entry or here, "vllm")
        if os.path.isfile(os.path.join(package, "__init__.py")):
            via = "site"
            if entry in extra:
                via = "working folder (python -m / python -c only)"
            elif os.path.abspath(entry) in pythonpath:
                via = "PYTHONPATH"
            candidates.append({"entry": os.path.abspath(entry), "via": via})
    return {
        "python": sys.executable,
        "python_version": ".".join(str(n) for n in sys.version_info[:3]),
        "cache_tag": sys.implementation.cache_tag,
        "optimize": sys.flags.optimize,
        "pycache_prefix": getattr(sys, "pycache_prefix", None),
        "check_hash_based_pycs": _check_hash_mode(),
        "sys_path": path,
        "pythonpath": pythonpath,
        "spec": found,
        "candidates": candidates,
        "distribution": _distribution(),
    }


def _distribution():
    try:
        from importlib import metadata
    except ImportError:
        return None
    try:
        dist = metadata.distribution("vllm")
    except metadata.PackageNotFoundError:
        return None
    direct_url = dist.read_text("direct_url.json")
    editable = False
    url = None
    if direct_url:
        try:
            parsed = json.loads(direct_url)
            url = parsed.get("url")
            editable = bool(parsed.get("dir_info", {}).get("editable"))
        except ValueError:
            pass
    dist_info = getattr(dist, "_path", None)
    return {
        "version": dist.version,
        "installer": (dist.read_text("INSTALLER") or "").strip() or None,
        "editable": editable,
        "url": url,
        "dist_info": str(dist_info) if dist_info else None,
        "package": os.path.abspath(str(dist.locate_file("vllm"))),
    }


def _modules(request):
    root = request["root"]
    # The loaders, in the order the path finder tries them: an extension module
    # or a package folder of the same name wins over the .py file.
    details = importlib._bootstrap_external._get_supported_file_loaders()
    answer = {}
    for relpath in request["files"]:
        folder, _, filename = relpath.rpartition("/")
        name = filename.rsplit(".", 1)[0]
        finder = importlib.machinery.FileFinder(os.path.join(root, folder), *details)
        spec = finder.find_spec(name)
        source = os.path.join(root, relpath)
        loads = spec.origin if spec is not None else None
        entry = {"loads": loads, "source": source}
        if loads is not None and os.path.samefile(loads, source):
            pyc, state, why = bytecode_state(source, request.get("thorough", True))
            entry.update(pyc=pyc, bytecode=state, why=why)
        answer[relpath] = entry
    return answer


def _import(request):
    import inspect

    root = request["root"]
    answer = []
    for relpath, qualname in request["functions"]:
        module_name = relpath[: -len(".py")].replace("/", ".")
        entry = {"path": relpath, "symbol": qualname}
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            # Not a verdict on the fix: this interpreter cannot run vLLM at all
            # (a dependency such as torch missing, a library that will not load).
            entry["live"] = False
            entry["imported"] = False
            entry["module"] = module_name
            entry["why"] = f"{type(exc).__name__}: {exc}"
            missing = getattr(exc, "name", None)
            if isinstance(exc, ModuleNotFoundError) and missing:
                entry["missing"] = missing
            answer.append(entry)
            continue
        entry["imported"] = True
        try:
            target = module
            for part in qualname.split("."):
                target = getattr(target, part)
            function = inspect.unwrap(target)
            live = function.__code__
            with open(os.path.join(root, relpath), "rb") as handle:
                compiled = compile(
                    handle.read(), module.__file__, "exec", dont_inherit=True
                )
            expected = _find_code(compiled, live.co_name, live.co_firstlineno)
            entry["module_file"] = module.__file__
            entry["live"] = expected is not None and expected == live
            entry["why"] = (
                ""
                if entry["live"]
                else ("the running function's code differs from the source on disk")
            )
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            entry["live"] = False
            entry["why"] = f"{type(exc).__name__}: {exc}"
        answer.append(entry)
    return answer


def _find_code(code, name, firstlineno):
    if code.co_name == name and code.co_firstlineno == firstlineno:
        return code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            found = _find_code(const, name, firstlineno)
            if found is not None:
                return found
    return None


def main():
    request = json.loads(sys.stdin.read())
    handler = {"where": _where, "modules": _modules, "import": _import}[request["ask"]]
    json.dump(handler(request), sys.stdout)


if __name__ == "__main__":
    main()

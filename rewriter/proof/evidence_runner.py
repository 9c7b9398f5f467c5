"""Measure patches' symptoms on trees; executed as a script by the measuring Python.

`deepstack-patch verify --gpu-evidence` starts this file with the interpreter
that has the torch to measure with (the proof environment, or ``--python``,
e.g. a venv over a GPU machine's CUDA torch), as::

    python evidence_runner.py REQUEST.json

The request names the device, where ``deepstack_patch`` and
``deepstack_patch.patches`` live, the runs (a tree, its side and the patch
ids) and where to write the results. No tree goes on ``sys.path``: the
measurements compile the tree's functions from its files, so vLLM need not
import here. Each patch's ``evidence.measure(tree, patch, device)`` returns
one side's measurement. Standard library only until the packages are loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import platform
import sys
import time
import traceback
from pathlib import Path


def _runner() -> object:
    spec = importlib.util.spec_from_file_location(
        "_proof_runner", Path(__file__).with_name("runner.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def device_info(device: str) -> dict:
    """The device, torch and CUDA versions every figure is labelled with."""
    import torch

    info = {
        "device": device,
        "kind": "cuda" if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
    }
    if info["kind"] == "cuda":
        info["name"] = torch.cuda.get_device_name(torch.device(device))
    else:
        info["name"] = _cpu_name()
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(request: dict) -> dict:
    runner = _runner()
    runner.load_package("deepstack_patch", request["package_dir"])
    runner.load_package("deepstack_patch.patches", request["patches_dir"])
    from deepstack_patch.patches import patch_by_id

    device = request["device"]
    output = {"environment": device_info(device), "results": []}
    out_path = Path(request["output"])
    for job in request["runs"]:
        tree = Path(job["tree"])
        for patch_id in job["patch_ids"]:
            patch = patch_by_id(patch_id)
            print(f"evidence {patch_id} on {job['side']} {tree}", file=sys.stderr)
            module = importlib.import_module(f"{type(patch).__module__}.evidence")
            started = time.monotonic()
            result = {"id": patch_id, "side": job["side"], "tree": str(tree)}
            try:
                result["measurement"] = module.measure(tree, patch, device)
                result["status"] = "measured"
            except Exception as exc:  # a measurement that could not run says why
                result["status"] = "error"
                result["error"] = f"{type(exc).__name__}: {exc}"
                result["traceback"] = traceback.format_exc()
            result["seconds"] = round(time.monotonic() - started, 2)
            output["results"].append(result)
            # Written after each measurement: a crash later keeps those so far.
            out_path.write_text(json.dumps(output))
    out_path.write_text(json.dumps(output))
    return output


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()))

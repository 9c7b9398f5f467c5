"""Cost per process of the live check vLLM runs as a general plugin.

    python bench/live_plugin.py --vllm-root SITE_PACKAGES_OR_TREE [--runs 5]

Each run is a fresh process that imports the plugin module and calls
``live_state`` on the given root (the folder holding ``vllm/``), as vLLM's
loader would after ``import vllm``. The figure is the time from before the
plugin's import to the end of the check: interpreter start-up, vLLM's own
import and the standard-library modules vLLM has imported by then (the child
imports them first) are not the plugin's cost. The runs share one fresh
cache folder, so the first is the full check and the rest are what every
later process pays. The target is 50 ms per process; nothing asserts it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# vLLM has imported these before it loads plugins: they are not the plugin's
# cost, and a bare interpreter would charge them to it.
CHILD = """
import ast, dataclasses, enum, hashlib, importlib.util, inspect, json, marshal
import pathlib, re, sys, time, typing
from pathlib import Path
started = time.perf_counter()
from deepstack_patch.liveness.live_plugin import live_state
state = live_state(Path(sys.argv[1]))
print(json.dumps({"ms": (time.perf_counter() - started) * 1000,
                  "live": state.live, "missing": sorted(state.missing)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-root", required=True)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, DEEPSTACK_PATCH_CACHE=cache)
        times = []
        for _ in range(args.runs + 1):
            done = subprocess.run(
                [sys.executable, "-c", CHILD, args.vllm_root],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(done.stdout)
            times.append(result["ms"])
    print(
        f"live: {', '.join(result['live']) or 'none'}; "
        f"missing: {', '.join(result['missing']) or 'none'}"
    )
    print(f"first process (full check, no cache): {times[0]:.0f} ms")
    print(
        f"later processes: median {statistics.median(times[1:]):.0f} ms, "
        f"max {max(times[1:]):.0f} ms over {len(times) - 1} (target 50 ms)"
    )


if __name__ == "__main__":
    main()

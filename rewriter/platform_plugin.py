"""vLLM platform plugin: the CPU platform, only when `deepstack-patch verify` asks.

From a source tree, vLLM's platform detection finds no built platform and ends
in ``UnspecifiedPlatform``, whose empty ``device_type`` makes the tree's tests
fail with "Device string must not be empty". vLLM loads out-of-tree platforms
from the ``vllm.platform_plugins`` entry-point group; this function is
registered there (pyproject.toml, and in the proof environment verify builds).
It returns None unless :data:`ENV_VAR` says ``cpu``, so installing
deepstack-patch next to a real GPU vLLM never changes its platform.
"""

from __future__ import annotations

import os

ENV_VAR = "DEEPSTACK_PATCH_VLLM_PLATFORM"
CPU_PLATFORM = "vllm.platforms.cpu.CpuPlatform"


def cpu_platform() -> str | None:
    """vLLM's CPU platform class when verify set :data:`ENV_VAR`, else None."""
    if os.environ.get(ENV_VAR) == "cpu":
        return CPU_PLATFORM
    return None

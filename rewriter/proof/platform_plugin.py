"""vLLM platform plugin: the CPU platform, only when `deepstack-patch verify` asks.

From a source tree, vLLM's platform detection finds no built platform and ends
in ``UnspecifiedPlatform``, whose empty ``device_type`` makes the tree's tests
fail with "Device string must not be empty". vLLM loads out-of-tree platforms
from the ``vllm.platform_plugins`` entry-point group; this function is
registered there (pyproject.toml, and in the proof environment verify builds).
It returns None unless :data:`ENV_VAR` says ``cpu``, so installing
deepstack-patch next to a real GPU vLLM never changes its platform.

The platform it names is vLLM's ``CpuPlatform`` with one tolerance: older
releases (0.17.0) probe ``torch._C._cpu._is_avx512_supported`` to choose
which compiled kernels to load, and torch 2.13 no longer has it. A source
tree has no compiled kernels to load anyway (vLLM itself only warns when
``vllm._C`` is missing), so that probe failing is logged, not fatal.
"""

from __future__ import annotations

import os
from typing import Any

ENV_VAR = "DEEPSTACK_PATCH_VLLM_PLATFORM"
CPU_PLATFORM = "vllm.platforms.cpu.CpuPlatform"
PLATFORM_CLASS = "SourceTreeCpuPlatform"


def cpu_platform() -> str | None:
    """The CPU platform's qualified name when verify set :data:`ENV_VAR`, else None."""
    if os.environ.get(ENV_VAR) == "cpu":
        return f"{__name__}.{PLATFORM_CLASS}"
    return None


def __getattr__(name: str) -> Any:
    # Built on first use: vLLM is importable only once vLLM asks for it.
    if name != PLATFORM_CLASS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import logging

    from vllm.platforms.cpu import CpuPlatform

    class SourceTreeCpuPlatform(CpuPlatform):
        """vLLM's CPU platform, for a source tree without compiled kernels."""

        @classmethod
        def import_kernels(cls) -> None:
            try:
                super().import_kernels()
            except AttributeError as exc:
                logging.getLogger(__name__).warning(
                    "vLLM's CPU kernel probe failed (%s); a source tree has no "
                    "compiled kernels, so verify goes on without them",
                    exc,
                )

    globals()[name] = SourceTreeCpuPlatform
    return SourceTreeCpuPlatform

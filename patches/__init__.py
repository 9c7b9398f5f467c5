"""The series: every upstream fix this tool carries, in the order it applies them.

Order matters where two patches touch the same function: a later patch sees
the code as the earlier ones left it.
"""

from __future__ import annotations

from deepstack_patch.protocol import Patch

from . import granite4_vision_deepstack_slice

SERIES: tuple[Patch, ...] = (granite4_vision_deepstack_slice.PATCH,)


def patch_by_id(patch_id: str) -> Patch:
    for patch in SERIES:
        if patch.id == patch_id:
            return patch
    raise KeyError(patch_id)

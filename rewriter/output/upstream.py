"""Where a patch's fix comes from, in words that are never empty.

A built-in patch names its pull request and the first release that has the
fix. A derived patch (``derive``) or a patch from elsewhere may have neither:
its upstream URL and first fixed release are whatever its author gave. Every
output (``list``, the status table, commits, DEP-3 headers, the SBOM) words
the fields it has and leaves the others out, never printing an empty one.
"""

from __future__ import annotations

import sys
from typing import Any


def derived_base(patch: Any) -> str:
    """The release a derived patch's diff was made against; "" otherwise."""
    # Never imported here: no derived patch exists unless its module is loaded.
    derived = sys.modules.get("deepstack_patch.engine.derived")
    if derived is None or not isinstance(patch, derived.DerivedPatch):
        return ""
    return str(patch.base)


def upstream_commit(patch: Any) -> str:
    """The upstream commit a derived patch was made from (``derive
    --commit``, its full sha); "" otherwise."""
    return str(getattr(patch, "commit", "") or "") if derived_base(patch) else ""


def origin_words(patch: Any) -> str:
    """How the fix reached the series, for prose: "derived from a diff
    against vLLM 0.20.2", or "" for a patch written by hand."""
    base = derived_base(patch)
    return f"derived from a diff against vLLM {base}" if base else ""


def upstream_words(patch: Any) -> str:
    """``list``'s upstream line: the URL and first release, as far as known."""
    url, fixed_in, origin = patch.upstream_url, patch.fixed_in, origin_words(patch)
    match (bool(url), bool(fixed_in)):
        case (True, True):
            return f"{url} (first in vLLM {fixed_in})"
        case (True, False):
            return f"{url} ({origin or 'no upstream release named'})"
        case (False, True):
            return f"first in vLLM {fixed_in}" + (f"; {origin}" if origin else "")
        case _:
            return f"none named ({origin})" if origin else "none named"


def fixed_in_label(patch: Any) -> str:
    """The status table's short note after the title, or ""."""
    if patch.fixed_in:
        return f"fixed in {patch.fixed_in}"
    base = derived_base(patch)
    return f"derived on {base}" if base else ""

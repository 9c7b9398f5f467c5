"""Which checks a plan hands to ty, counted wherever they go: to the
servers that check them while the plan goes on
(:class:`~deepstack_patch.engine.derived.typecheck.ChecksAhead`), or to a
batch at the pass's end (``diagnostics_of``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from deepstack_patch.engine.derived import typecheck


def checks_handed_to_ty(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of each check handed to ty from now on, in order."""
    handed: list[str] = []
    batch = typecheck.diagnostics_of
    ask = typecheck.ChecksAhead.ask

    def batched(root: Path, checks: list[typecheck.Check]):  # type: ignore[no-untyped-def]
        handed.extend(check.path for check in checks)
        return batch(root, checks)

    def asked(self: typecheck.ChecksAhead, check: typecheck.Check) -> int | None:
        number = ask(self, check)
        if number is not None:  # else it goes to the batch
            handed.append(check.path)
        return number

    monkeypatch.setattr(typecheck, "diagnostics_of", batched)
    monkeypatch.setattr(typecheck.ChecksAhead, "ask", asked)
    return handed

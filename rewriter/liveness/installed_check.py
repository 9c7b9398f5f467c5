"""pytest plugin: the release's tests must run against the installed vLLM.

``verify --installed`` runs tests taken from the release's sdist; a ``vllm/``
beside them (or anywhere earlier on ``sys.path``) would be tested instead of
the install, and every test could pass without touching the installed code.
This plugin stops the run loudly when ``vllm`` would be, or was, imported
from anywhere but the installed package named by :data:`ENV_VAR`.

Loaded by pytest as ``-p`` or through ``PYTEST_PLUGINS`` from a copy of this
file on ``PYTHONPATH`` (the interpreter need not have deepstack-patch), so it
uses the standard library and pytest only.
"""

from __future__ import annotations

import importlib.util
import os
import sys

#: The module name the copy is imported as.
MODULE = "deepstack_patch_installed_check"
#: The installed ``vllm/__init__.py`` the tests must import.
ENV_VAR = "DEEPSTACK_PATCH_EXPECT_VLLM"
#: pytest's exit code when the check fails after the tests ran (internal error).
WRONG_VLLM_EXIT = 3


def _expected() -> str | None:
    return os.environ.get(ENV_VAR) or None


def _same(found: str | None, expected: str) -> bool:
    return found is not None and os.path.realpath(found) == os.path.realpath(expected)


def _message(found: str | None, expected: str) -> str:
    return (
        f"deepstack-patch: the tests import vllm from {found or 'nowhere'}, not "
        f"the installed {expected}: they would not test the installed vLLM"
    )


def pytest_configure(config: object) -> None:
    """Before any test module imports: where ``import vllm`` would look."""
    expected = _expected()
    if expected is None:
        return
    spec = importlib.util.find_spec("vllm")
    found = spec.origin if spec is not None else None
    if not _same(found, expected):
        import pytest

        raise pytest.UsageError(_message(found, expected))


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    """After the tests: the ``vllm`` they did import, if any."""
    expected = _expected()
    module = sys.modules.get("vllm")
    if expected is None or module is None:
        return
    found = getattr(module, "__file__", None)
    if not _same(found, expected):
        sys.stderr.write(_message(found, expected) + "\n")
        session.exitstatus = WRONG_VLLM_EXIT  # type: ignore[attr-defined]

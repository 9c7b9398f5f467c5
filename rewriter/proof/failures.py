"""Why a test did not pass, in words a person can act on.

A recorded test (a derived patch's, from its pull request) runs in the CPU
proof environment, which has no network, no GPU and only vLLM's smallest
set of dependencies. A test that fails because one of those is absent shows
nothing about the fix, either way: it *could not run*, which is not a
failure of the fix (``proof failed``) nor a proof that did not show the bug
(``not-proven``). :func:`environment_cause` tells that case from a failure
of the code, from the message pytest reported; :func:`failure_summary` is
the line a person reads: the exception and its message, or the last lines
of the traceback, never a lone closing bracket of a multi-line call.
"""

from __future__ import annotations

import re

from deepstack_patch.proof.pytest_results import RAN_PAST

#: What a test raises where it needs the network: a model or a file from the
#: Hugging Face Hub (offline: LocalEntryNotFoundError), any HTTP request.
NETWORK_MARKERS = (
    "huggingface_hub.errors.LocalEntryNotFoundError",
    "huggingface_hub.errors.OfflineModeIsEnabled",
    "LocalEntryNotFoundError",
    "couldn't connect to 'https://huggingface.co'",
    "requests.exceptions.ConnectionError",
    "urllib3.exceptions.MaxRetryError",
    "urllib3.exceptions.NameResolutionError",
    "httpx.ConnectError",
    "socket.gaierror",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    # Hugging Face offline (HF_HUB_OFFLINE=1): a model's config or snapshot
    # that is not in the local cache, as vLLM's ModelConfig and the hub say.
    "Invalid repository ID or local directory specified",
    "outgoing traffic has been disabled",
    # openai_harmony fetches its encoding's vocabulary file where no copy is
    # cached (HarmonyError).
    "failed to download or load vocab file",
)

#: What vLLM raises where a feature needs one of its optional extras
#: (``vllm[bench]``, ``vllm[audio]``), whose packages the proof environment
#: does not hold.
_EXTRA_MISSING = re.compile(r"Please install vllm\[([\w-]+)\]")

#: What pytest says of an ``async def`` test without an async plugin: the
#: plugin vLLM's tests use (pinned in its test requirements) is missing.
ASYNC_PLUGIN_MISSING = "async def functions are not natively supported"
ASYNC_PLUGIN = "pytest_asyncio"

#: What torch says where a test needs a GPU the machine lacks.
GPU_MARKERS = (
    "Torch not compiled with CUDA enabled",
    "No CUDA GPUs are available",
    "Found no NVIDIA driver",
    # vLLM's sleep-mode allocator (CuMemAllocator) exists on CUDA only.
    "cumem allocator is not available",
)

#: What a test that listens on a fixed port says where another process has
#: it: verify runs the pristine and the patched tree's tests at once, so a
#: test that binds ``12345`` on both may lose on either side, a pass on one
#: and a failure on the other that says nothing of the fix.
PORT_TAKEN_MARKERS = ("EADDRINUSE", "Address already in use")

#: What torch says where a test calls one of vLLM's compiled operators: a
#: source tree has none built (``torch.ops._C.fused_add_rms_norm``).
COMPILED_OPS_MISSING = re.compile(r"'_OpNamespace' '(_C\w*)' object has no attribute")

#: Packages that belong to the tree under test: a module of theirs that does
#: not import is the code's failure (on a pristine tree: what the fix adds).
TREE_PACKAGES = frozenset({"vllm", "tests"})

_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
#: ``ValueError: ...``, ``huggingface_hub.errors.X: ...``, ``Failed: ...``.
_EXCEPTION_LINE = re.compile(r"^(?:[a-z_][\w]*\.)*[A-Z]\w*: \S")
#: pytest's prefix of the lines of an exception in a report.
_PYTEST_E = re.compile(r"^E +")


def _starts_failure(line: str) -> bool:
    """An exception's first line, or an assertion as pytest reports it."""
    return bool(_EXCEPTION_LINE.match(line)) or line.startswith("assert ")


def environment_cause(message: str) -> str:
    """What the proof environment lacks, where a test's failure says so
    (``"no network"``, ``"the package 'x' is not installed"``, ``"no
    GPU"``); ``""`` where the failure is the code's."""
    match _MISSING_MODULE.search(message):
        case re.Match() as found if found[1].split(".")[0] not in TREE_PACKAGES:
            return f"the package {found[1].split('.')[0]!r} is not installed"
    if found := _EXTRA_MISSING.search(message):
        return f"vLLM's optional extra {found[1]!r} is not installed"
    if ASYNC_PLUGIN_MISSING in message:
        return f"the package {ASYNC_PLUGIN!r} is not installed"
    if any(marker in message for marker in NETWORK_MARKERS):
        return "no network"
    if any(marker in message for marker in GPU_MARKERS):
        return "no GPU"
    if any(marker in message for marker in PORT_TAKEN_MARKERS):
        return "a network port it listens on was taken (both trees' tests run at once)"
    if found := COMPILED_OPS_MISSING.search(message):
        return f"vLLM's compiled operators ({found[1]}) are not built in a source tree"
    if RAN_PAST in message:
        return "it ran past its time limit (its patch's time budget, a test)"
    return ""


def failure_summary(message: str, limit: int = 300) -> str:
    """The line that says why a test failed: the exception with its
    message (an assertion as pytest rewrote it), its lines joined, else the
    last three lines of the report that say something; at most ``limit``
    characters."""
    raw = message.splitlines()
    # In a whole report (a module that did not import) the exception is on
    # pytest's E lines; the rest is traceback and advice ("Hint: ...").
    if any(_PYTEST_E.match(line) for line in raw):
        raw = [line for line in raw if _PYTEST_E.match(line)]
    lines = [_PYTEST_E.sub("", line).strip() for line in raw]
    lines = [line for line in lines if line]
    start = next((i for i, line in enumerate(lines) if _starts_failure(line)), None)
    if start is not None:
        # The exception and what follows it, on one line: a multi-line
        # message (a repr that spans lines, pytest's "+ where") reads whole.
        summary = " ".join(lines[start:])
    else:
        told = [line for line in lines if any(c.isalnum() for c in line)]
        summary = " | ".join(told[-3:])
    return summary if len(summary) <= limit else summary[: limit - 1] + "…"


#: A call or a lookup the release's code does not answer: the test was
#: written for a later release (an argument, an attribute or a name it added).
_RELEASE_LACKS = (
    (
        re.compile(r"TypeError: .*got an unexpected keyword argument '(\w+)'"),
        "an argument",
    ),
    (re.compile(r"AttributeError: .*has no attribute '(\w+)'"), "an attribute"),
    # ``assert hasattr(obj, "name")`` as pytest rewrites it: a test that
    # looks for a field a later pull request added.
    (
        re.compile(
            r"AssertionError: assert False\s*\+\s+where False = hasattr\(.*, '(\w+)'\)"
        ),
        "an attribute",
    ),
    (re.compile(r"ImportError: cannot import name '(\w+)'"), "a name"),
)


def release_lacks(summary: str) -> tuple[str, str] | None:
    """What the release's own code lacks, where a failure's summary says a
    test called or looked up something it does not have: its kind and name
    (``("an argument", "engine_id")``); None for any other failure."""
    for pattern, kind in _RELEASE_LACKS:
        match pattern.search(summary):
            case re.Match() as found:
                return kind, found[1]
    return None


#: A path in parentheses, as ImportError names the module's file: the trees
#: compared live in different folders.
_PATH_IN_PARENTHESES = re.compile(r" \((?:/|[A-Za-z]:\\)[^)]*\)")


def same_failure(one: str, other: str) -> bool:
    """Two failures' messages say the same, wherever their trees are."""
    return _PATH_IN_PARENTHESES.sub("", failure_summary(one)) == (
        _PATH_IN_PARENTHESES.sub("", failure_summary(other))
    )

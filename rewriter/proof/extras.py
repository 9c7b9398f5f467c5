"""What a test needs beyond the proof environment: pure-Python packages at
the release's pins (issue 42, item 3).

A recorded or selected test that could not run because a package outside
vLLM is missing (``No module named 'multiprocess'``, ``failures.py``) gets
it, where the release pins it for its tests (``requirements/test.txt``, or
``requirements/test/*.txt`` from 0.19 on) and pip can install it, and what
it pulls, as pure-Python wheels at those pins:

- the packages go into an **overlay** venv, never into the managed
  environment that every run shares: a ``.pth`` file puts the managed
  environment's site-packages on its path, so its torch and the rest are
  there and pip sees them installed; the overlay is keyed by the managed
  environment and the requirements (``<cache>/envs/extras-<key>``), built
  once under a file lock like the managed one, and reused;
- pip runs as the user configured it, with ``--only-binary :all:`` and a
  constraints file that holds every package of the managed environment at
  its version (torch stays the CPU build: pip can never pull another) and
  the release's pins for the rest;
- before installing, ``pip install --dry-run --report`` says what would be
  installed, and refuses the install, with the wheel's name, where one is
  GPU code or a GPU runtime (``nvidia-*``, ``cuda-*``, ``triton``,
  ``cupy``, ``flashinfer``, a ``cu12``/``+cu130`` build, ``rocm``) or a
  compiled extension of torch (``torchvision``: built against one torch
  build, it breaks the import of every test that loads it beside the CPU
  one), and where one is compiled at all: pure-Python wheels
  (``none-any``) only. Compiled CPU wheels (``watchfiles``, ``ray``,
  ``numba``, ``scipy``) were let in for a day (2026-11-29): on the 40-fix
  batch of 0.20.2 they gave no fix evidence (what they let run failed on
  both trees on the CPU); with them, and the release's tests selected one
  import further for every patch, two of this repository's verify tests
  took 10 and 11 minutes (19 s and 79 s without both; which cost what was
  not measured apart). Tried again on 2026-11-30, once each test was
  traced, for vLLM's own run-time requirements only (``watchfiles``,
  ``opencv-python-headless`` for ``cv2``, from ``requirements/common.txt``):
  no fix more with evidence (what they let run failed on both trees or
  needed the network, a GPU or ``av``), and the batch's verify went from
  8 min 51 s to 18 min 24 s (docs/verify.md).

A package the release does not pin, a compiled one, or one the index
lacks at the pin stays ``could not run``, and the reason says which. A pin that
conflicts with a package of the managed environment (the release's
pytest-asyncio 0.24.0 needs pytest < 9; the environment has pytest 9) goes
in at the newest version that goes beside them, and ``unpinned`` says so.
CUDA-only and network-only tests are never helped here. Nothing here names
a fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.proof.envs import (
    PLUGIN_DIST,
    TORCH_PIN,
    ProofEnv,
    envs_dir,
    pip_install_command,
    venv_python,
)

#: Where releases pin their test requirements, first found first.
PIN_FILES = ("requirements/test.txt", "requirements/test/cuda.txt")
PIN_GLOB = "requirements/test/*.txt"

#: Modules that come from a distribution of another name, for the ones
#: vLLM's requirements name (pip maps a module to its distribution only
#: once it is installed): ``import cv2`` is opencv-python-headless.
DISTRIBUTION_OF = {
    "cv2": "opencv-python-headless",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "zmq": "pyzmq",
    "google": "protobuf",
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;#]+)")
_MISSING = re.compile(r"the package '([\w.]+)' is not installed")


def normalized(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release_pins(tree: Path) -> dict[str, str]:
    """The release's pinned test requirements, ``{normalized name: "name==v"}``."""
    files = [tree / name for name in PIN_FILES]
    files += sorted(tree.glob(PIN_GLOB))
    pins: dict[str, str] = {}
    for path in dict.fromkeys(files):
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            match _PIN.match(line.strip()):
                case re.Match() as found:
                    pins.setdefault(normalized(found[1]), f"{found[1]}=={found[3]}")
    return pins


def distribution(module: str) -> str:
    """The normalized name of the distribution a top-level module comes from."""
    return normalized(DISTRIBUTION_OF.get(module, module))


def missing_packages(reasons: Iterable[str]) -> list[str]:
    """The top-level modules the reasons say are not installed, in order."""
    found = (m[1] for reason in reasons for m in _MISSING.finditer(reason))
    return list(dict.fromkeys(found))


@dataclass
class Extras:
    """What was asked for, what the overlay gives, and why not the rest."""

    #: The requirements installed (the release's pins), by module.
    installed: dict[str, str] = field(default_factory=dict)
    #: Why a module was not installed, by module.
    refused: dict[str, str] = field(default_factory=dict)
    #: Why a module went in at the newest version that goes beside the
    #: managed environment's packages, not at the release's pin, by module.
    unpinned: dict[str, str] = field(default_factory=dict)
    env: ProofEnv | None = None

    def json(self) -> dict[str, object]:
        return {
            "installed": self.installed,
            "refused": self.refused,
            "unpinned": self.unpinned,
            "python": str(self.env.python) if self.env else None,
        }


def provide(
    base: ProofEnv,
    tree: Path,
    modules: Sequence[str],
    say=lambda line: None,
    earlier: Extras | None = None,
) -> Extras:
    """An overlay of ``base`` with the release's pins of ``modules``, where
    each is pinned and pure Python (see the module docstring). ``earlier``:
    what an earlier round decided (what it added, at which requirement, and
    what it refused), kept as it is; only ``modules`` are asked of pip."""
    extras = Extras()
    if earlier is not None:
        extras.installed = dict(earlier.installed)
        extras.refused = dict(earlier.refused)
        extras.unpinned = dict(earlier.unpinned)
    if not base.managed:
        for module in modules:
            extras.refused[module] = (
                f"--python {base.python} is your environment: verify installs "
                "nothing into it"
            )
        return extras
    pins = release_pins(tree)
    asked = []
    for module in modules:
        name = distribution(module)
        pin = pins.get(name)
        if pin is None:
            called = repr(module)
            if name != normalized(module):
                called += f" ({name})"
            extras.refused[module] = (
                f"the release pins no test requirement named {called} "
                f"({', '.join(PIN_FILES)}, {PIN_GLOB})"
            )
        else:
            extras.installed[module] = pin
            asked.append(module)
    if not extras.installed:
        return extras
    try:
        extras.env = overlay(
            base, sorted(extras.installed.values()), _kept(pins, extras), say
        )
        return extras
    except DeepstackError:
        pass
    # One that cannot be installed must not keep the others out: each alone;
    # one whose pin cannot go beside the managed environment's packages, at
    # the newest version that can.
    for module in asked:
        try:
            _dry_run(base, [extras.installed[module]], pins)
        except DeepstackError as exc:
            if not _beside_the_environment(base, extras, module, pins, exc):
                _refuse(extras, exc, module)
    if extras.installed:
        try:
            extras.env = overlay(
                base, sorted(extras.installed.values()), _kept(pins, extras), say
            )
        except DeepstackError as exc:
            _refuse(extras, exc)
    return extras


def _kept(pins: dict[str, str], extras: Extras) -> dict[str, str]:
    """The release's pins, less those of the packages that went in at their
    newest version beside the managed environment."""
    unpinned = {distribution(module) for module in extras.unpinned}
    return {name: pin for name, pin in pins.items() if name not in unpinned}


def _beside_the_environment(
    base: ProofEnv,
    extras: Extras,
    module: str,
    pins: dict[str, str],
    refused: DeepstackError,
) -> bool:
    """Whether ``module``, whose pin pip refused because it conflicts with a
    package of the managed environment (pytest-asyncio 0.24.0, which needs
    pytest < 9, beside the environment's pytest 9), goes in unpinned: the
    newest pure-Python version that goes beside them (the constraints hold
    every package of the environment at its version). Recorded in
    ``extras.unpinned``; a refused wheel or a package the index lacks is
    never tried again."""
    if "conflict" not in refused.message.lower():
        return False
    name = distribution(module)
    without = {other: pin for other, pin in pins.items() if other != name}
    try:
        _dry_run(base, [name], without)
    except DeepstackError:
        return False
    extras.unpinned[module] = (
        f"the release pins {extras.installed[module]}, which conflicts with the "
        f"managed environment's packages ({refused.message})"
    )
    extras.installed[module] = name
    return True


def _refuse(extras: Extras, exc: DeepstackError, module: str = "") -> None:
    """``module`` (else every one asked for) refused, with pip's reason."""
    for name in [module] if module else list(extras.installed):
        requirement = extras.installed.pop(name)
        extras.refused[name] = f"{requirement} not installed: {exc.located}"


#: What decides which wheels may go into an overlay (:func:`unfit_wheels`),
#: in the overlay's key: an overlay built under other rules (compiled
#: wheels let in, as they were for a day) is never taken for one built
#: under these. Raise it when the rules change.
OVERLAY_RULES = 2


def overlay(
    base: ProofEnv,
    requirements: Sequence[str],
    pins: dict[str, str],
    say=lambda line: None,
) -> ProofEnv:
    """The overlay venv of ``base`` with ``requirements``, built once."""
    from filelock import FileLock

    key = hashlib.sha256(
        json.dumps([base.key, sorted(requirements), OVERLAY_RULES]).encode()
    ).hexdigest()[:16]
    root = envs_dir() / f"extras-{key}"
    marker = root / "complete"
    with FileLock(str(root) + ".lock", timeout=3600):
        if marker.is_file() and venv_python(root).exists():
            return ProofEnv(venv_python(root), root, key)
        shutil.rmtree(root, ignore_errors=True)
        say(f"adding {', '.join(requirements)} in {root}")
        try:
            _build_overlay(base, root, requirements, pins)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        marker.write_text(json.dumps({"requirements": list(requirements)}) + "\n")
        return ProofEnv(venv_python(root), root, key, built_now=True)


def _build_overlay(
    base: ProofEnv, root: Path, requirements: Sequence[str], pins: dict[str, str]
) -> None:
    _run([str(base.python), "-m", "venv", "--without-pip", str(root)], "a venv")
    python = venv_python(root)
    base_site = _site_packages(base.python)
    (Path(_site_packages(python)) / "deepstack_base.pth").write_text(base_site + "\n")
    with _pip_options(base, pins) as (pip, options):
        _dry_run(base, requirements, pins)
        install = pip_install_command(python, [])[3:]
        _run([*pip, "--python", str(python), *install, *options, *requirements], "pip")


def _dry_run(base: ProofEnv, requirements: Sequence[str], pins: dict[str, str]) -> None:
    """What pip would install for ``requirements`` over ``base``: refused
    (a DeepstackError) where it cannot resolve or a wheel is refused."""
    with (
        _pip_options(base, pins) as (pip, options),
        tempfile.TemporaryDirectory(prefix="deepstack-extras-") as scratch,
    ):
        report = Path(scratch) / "report.json"
        install = pip_install_command(base.python, [])[3:]
        _run(
            [*pip, *install, "--dry-run", "--report", str(report), *options,
             *requirements],
            "pip",
        )  # fmt: skip
        unfit = unfit_wheels(json.loads(report.read_text()))
        if unfit:
            raise DeepstackError(
                f"not for the CPU environment: {', '.join(unfit)}",
                "give --python an environment that has it",
            )


@contextlib.contextmanager
def _pip_options(
    base: ProofEnv, pins: dict[str, str]
) -> Iterator[tuple[list[str], list[str]]]:
    """The base's pip, and the options every call takes: wheels only, and
    the constraints (the base's packages at their versions, torch's pin,
    the release's pins for the rest)."""
    frozen = _frozen(base.python)
    constraints = [*frozen.values(), TORCH_PIN]
    constraints += [pin for name, pin in pins.items() if name not in frozen]
    with tempfile.TemporaryDirectory(prefix="deepstack-extras-") as scratch:
        constraint_file = Path(scratch) / "constraints.txt"
        constraint_file.write_text("\n".join(constraints) + "\n")
        options = ["--only-binary", ":all:", "-c", str(constraint_file)]
        yield [str(base.python), "-m", "pip"], options


#: A wheel of GPU code or of a GPU runtime, by its file name: NVIDIA's
#: runtimes, CUDA's bindings, Triton, CuPy, FlashInfer, a build for one CUDA
#: (``cupy_cuda12x``, ``nvidia_nccl_cu13``, ``torch-2.11.0+cu130``) or ROCm.
GPU_WHEEL = re.compile(
    r"^(nvidia|cuda|cupy|triton|pytorch_triton|flashinfer)"
    r"|_cu\d|_cuda\d|\+(cu|rocm)\d",
    re.IGNORECASE,
)
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def unfit_wheels(report: dict) -> list[str]:
    """The wheels of a pip report (``--report``) that cannot go beside the
    CPU environment, each with why: GPU code (``GPU_WHEEL``); a compiled
    extension of torch (``torchvision``: built against one torch build, its
    operators fail to load beside the CPU one, and with them every test
    that imports it, transformers' included); what is not a wheel (it would
    build); any other compiled wheel (see the module docstring)."""
    found = []
    for item in report.get("install", []):
        url = str(item.get("download_info", {}).get("url", ""))
        name = unquote(url.rsplit("/", 1)[-1].split("#")[0])
        metadata = item.get("metadata", {})
        name = name or str(metadata.get("name", "?"))
        requires = {
            normalized(m[1])
            for r in metadata.get("requires_dist") or []
            if (m := _REQUIREMENT_NAME.match(r))
        }
        if not name.endswith(".whl"):
            found.append(f"{name} (not a wheel)")
        elif GPU_WHEEL.search(name):
            found.append(f"{name} (GPU code)")
        elif "torch" in requires and not name.endswith("-none-any.whl"):
            found.append(f"{name} (compiled against one torch build)")
        elif not name.endswith("-none-any.whl"):
            found.append(f"{name} (compiled)")
    return found


def _site_packages(python: Path) -> str:
    done = _run(
        [
            str(python),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        "the interpreter",
    )
    return done.stdout.strip()


def _frozen(python: Path) -> dict[str, str]:
    """The managed environment's packages, ``{normalized name: "name==v"}``."""
    done = _run(
        [str(python), "-m", "pip", "list", "--format", "json",
         "--disable-pip-version-check"],
        "pip list",
    )  # fmt: skip
    return {
        normalized(row["name"]): f"{row['name']}=={row['version']}"
        for row in json.loads(done.stdout)
        if normalized(row["name"]) != normalized(PLUGIN_DIST)
    }


def _run(command: list[str], what: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
        # pip's own errors, not its warnings about the index's locations.
        errors = [line for line in lines if line.startswith("ERROR:")]
        tail = errors[:2] or lines[-3:]
        raise DeepstackError(
            f"{what} failed: {' | '.join(tail) or f'exit code {done.returncode}'}",
            "check that your package index (PIP_INDEX_URL / pip.conf) has it",
        )
    return done

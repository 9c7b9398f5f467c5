"""The release matrix as a CI pipeline: one backport + verify job per release.

``matrix --emit`` writes a GitHub Actions workflow or a Buildkite pipeline
whose jobs run on separate CI workers; each job installs deepstack-patch,
backports one release and verifies it, and keeps the outputs as artifacts:
the patched tarball, the series, report.json, verify.xml, the SBOM and the
unsigned in-toto statement. A GitHub job also has GitHub sign the tarball
(``actions/attest-build-provenance``) once it is verified. With ``watch``,
a scheduled run (weekly on GitHub; on Buildkite, a schedule set in the
pipeline's settings) runs ``deepstack-patch watch`` instead, and fails when
upstream changed the code a carried fix depends on in a way nobody reviewed.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import Any

from deepstack_patch.distribution.provenance import PROVENANCE_NAME, SBOM_NAME
from deepstack_patch.engine.errors import DeepstackError
from deepstack_patch.engine.targets import Targets

DEFAULT_INSTALL = "python -m pip install '.[verify,vendor]'"
#: The local version label every emitted job gives its release.
LABEL = "deepstack.1"

#: What every job keeps, relative to its backport folder.
ARTIFACTS = (
    "*.tar.gz",
    "series/",
    "report.json",
    "verify.xml",
    SBOM_NAME,
    PROVENANCE_NAME,
)

#: GitHub's artifact attestation: a SLSA provenance statement for the subject,
#: signed with a Sigstore certificate for the workflow's OIDC identity and
#: stored by GitHub (`gh attestation verify` checks it).
ATTEST_ACTION = "actions/attest-build-provenance@v2"
#: What the attest step needs of the job's token: an OIDC token to be issued
#: a signing certificate, the right to store the attestation, and (since a
#: job's `permissions` turn every unnamed one off) reading the repository for
#: actions/checkout.
ATTEST_PERMISSIONS = {
    "id-token": "write",
    "attestations": "write",
    "contents": "read",
}


#: When the emitted GitHub workflow runs the watch of upstream (UTC, Mondays).
WATCH_CRON = "17 5 * * 1"


def watch_command(since: str) -> str:
    """The watch a scheduled run makes: every release since ``since`` up to the
    newest on the index; exit 1 (a failed job) when a change is new."""
    return f"deepstack-patch watch --since {shlex.quote(since)}"


def backport_folder(version: str) -> str:
    """The folder, relative to the job's workspace, one job backports into."""
    return f"backport-{version}"


def backport_tarball(version: str, label: str = LABEL) -> str:
    """The patched sdist `backport` writes there, relative to the workspace."""
    from deepstack_patch.distribution.sdist import local_version

    return f"{backport_folder(version)}/vllm-{local_version(version, label)}.tar.gz"


def _release_commands(
    version: str, skip: Sequence[str], label: str = LABEL
) -> list[str]:
    """The shell commands one CI job runs for one release."""
    from deepstack_patch.distribution.sdist import local_version

    skips = "".join(f" --skip {shlex.quote(patch_id)}" for patch_id in skip)
    out = backport_folder(version)
    tree = f"{out}/vllm-{local_version(version, label)}"
    return [
        f"deepstack-patch backport --release {version} --out {out} "
        f"--local-version {shlex.quote(label)}{skips}",
        f"deepstack-patch verify --vllm-src {shlex.quote(tree)}{skips} "
        f"--junit-xml {out}/verify.xml",
    ]


def _skipped(targets: Targets) -> Callable[[str], list[str]]:
    """Patches targets.toml expects drifted on a release: that job skips them."""

    def skipped(version: str) -> list[str]:
        return sorted(
            patch_id
            for patch_id, state in targets.expected(version).items()
            if state.value == "drifted"
        )

    return skipped


def github_actions(
    releases: Sequence[str],
    targets: Targets,
    install: str,
    attest: bool = True,
    watch: bool = True,
) -> dict[str, Any]:
    """One matrix job per release; with ``attest``, the job signs its tarball;
    with ``watch``, a weekly scheduled run watches upstream instead."""
    skipped = _skipped(targets)
    include = [
        {
            "release": version,
            "run": "\n".join(_release_commands(version, skipped(version))),
            "tarball": backport_tarball(version),
        }
        for version in releases
    ]
    folder = backport_folder("${{ matrix.release }}")
    steps = [
        *_github_setup("deepstack-patch-${{ matrix.release }}", install),
        {"name": "Backport and verify", "run": "${{ matrix.run }}"},
        # Without `if:`, only a tarball whose release verified is signed.
        *([_attest_step()] if attest else []),
        {
            "uses": "actions/upload-artifact@v4",
            "if": "always()",
            "with": {
                "name": "vllm-${{ matrix.release }}-deepstack",
                "path": "\n".join(f"{folder}/{a}" for a in ARTIFACTS),
            },
        },
    ]
    # Least privilege: the token gets only what the steps need.
    permissions = ATTEST_PERMISSIONS if attest else {"contents": "read"}
    backport: dict[str, Any] = {
        "name": "vLLM ${{ matrix.release }}",
        "runs-on": "ubuntu-latest",
        "timeout-minutes": 90,
        "permissions": dict(permissions),
        "strategy": {"fail-fast": False, "matrix": {"include": include}},
        "steps": steps,
    }
    triggers: dict[str, Any] = {"workflow_dispatch": {}, "push": {"branches": ["main"]}}
    jobs = {"backport": backport}
    if watch:
        triggers["schedule"] = [{"cron": WATCH_CRON}]
        backport["if"] = "github.event_name != 'schedule'"
        jobs["watch"] = {
            "name": "Watch upstream",
            "if": "github.event_name == 'schedule'",
            "runs-on": "ubuntu-latest",
            "timeout-minutes": 60,
            "permissions": {"contents": "read"},
            "steps": [
                # A cache entry never changes once saved: a key per run, restored
                # from the newest, keeps each week's new releases.
                *_github_setup(
                    "deepstack-patch-watch-${{ github.run_id }}",
                    install,
                    restore="deepstack-patch-watch-",
                ),
                {"name": "Watch upstream", "run": watch_command(releases[0])},
            ],
        }
    return {"name": "deepstack-patch backports", "on": triggers, "jobs": jobs}


def _github_setup(
    cache_key: str, install: str, restore: str | None = None
) -> list[dict[str, Any]]:
    """Checkout, Python, the cache of release tarballs, and the install."""
    cache = {"path": "~/.cache/deepstack-patch", "key": cache_key}
    if restore:
        cache["restore-keys"] = restore
    return [
        {"uses": "actions/checkout@v4"},
        {"uses": "actions/setup-python@v5", "with": {"python-version": "3.12"}},
        {
            "name": "Cache release tarballs",
            "uses": "actions/cache@v4",
            "with": cache,
        },
        {"name": "Install deepstack-patch", "run": install},
    ]


def _attest_step() -> dict[str, Any]:
    return {
        "name": "Attest the patched tarball",
        "uses": ATTEST_ACTION,
        "with": {"subject-path": "${{ matrix.tarball }}"},
    }


def buildkite(
    releases: Sequence[str], targets: Targets, install: str, watch: bool = True
) -> dict[str, Any]:
    """One step per release; with ``watch``, a build that a schedule started
    (set in the pipeline's settings) watches upstream instead."""
    skipped = _skipped(targets)
    steps = [
        {
            "label": f":hammer: vLLM {version}",
            "key": "backport-" + version.replace(".", "-"),
            "commands": [install, *_release_commands(version, skipped(version))],
            "artifact_paths": [
                f"{backport_folder(version)}/{a}" + ("*" if a.endswith("/") else "")
                for a in ARTIFACTS
            ],
            "timeout_in_minutes": 90,
        }
        for version in releases
    ]
    group: dict[str, Any] = {
        "group": ":package: deepstack-patch backports",
        "key": "deepstack-backports",
        "steps": steps,
    }
    if not watch:
        return {"steps": [group]}
    group["if"] = 'build.source != "schedule"'
    watch_step = {
        "label": ":eyes: watch upstream",
        "key": "watch-upstream",
        "if": 'build.source == "schedule"',
        "commands": [install, watch_command(releases[0])],
        "timeout_in_minutes": 60,
    }
    return {"steps": [group, watch_step]}


PIPELINES = ("github-actions", "buildkite")


def emit_pipeline(
    kind: str,
    releases: Sequence[str],
    targets: Targets,
    install: str,
    attest: bool = True,
    watch: bool = True,
) -> str:
    """A GitHub Actions workflow or a Buildkite pipeline, one job per release.

    Patches targets.toml expects drifted on a release are skipped in that
    release's job: a drifted patch makes backport refuse the whole release.
    ``attest`` adds GitHub's signed attestation of each tarball; Buildkite
    has no such step, so it only keeps the unsigned statement.
    """
    import yaml

    match kind:
        case "github-actions":
            document = github_actions(releases, targets, install, attest, watch)
        case "buildkite":
            document = buildkite(releases, targets, install, watch)
        case _:  # click's Choice keeps this unreachable from the CLI
            raise DeepstackError(
                f"--emit {kind}: unknown pipeline kind",
                "choose github-actions or buildkite",
            )
    header = (
        "# Generated by `deepstack-patch matrix --emit "
        f"{kind}`: one backport job per vLLM release.\n"
        "# Regenerate it rather than editing it by hand.\n"
    )
    return header + yaml.dump(
        document, Dumper=_pipeline_dumper(), sort_keys=False, width=100
    )


def _pipeline_dumper() -> type:
    import yaml

    class Dumper(yaml.SafeDumper):
        """Multi-line shell scripts as ``|`` blocks, as people write them."""

    def represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
        style = "|" if "\n" in text else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)

    Dumper.add_representer(str, represent_str)
    return Dumper

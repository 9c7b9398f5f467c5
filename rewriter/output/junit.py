"""A verify run as JUnit XML, for CI dashboards (``verify --junit-xml FILE``)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from deepstack_patch.engine.protocol import PatchState


def junit_xml(report: Any) -> str:
    """Every check as a JUnit test case, for CI dashboards."""
    suite = ET.Element("testsuite", name="deepstack-patch verify")
    version = report.tree.version

    def case(classname: str, name: str, seconds: float = 0.0) -> ET.Element:
        return ET.SubElement(
            suite, "testcase", classname=classname, name=name, time=f"{seconds:.2f}"
        )

    for verdict in report.verdicts:
        pid = verdict.patch.id
        if verdict.state is PatchState.NOT_APPLICABLE:
            element = case(f"proof.{version}", pid)
            ET.SubElement(
                element, "skipped", message=f"not-applicable: {verdict.reason}"
            )
            continue
        imports = verdict.imports
        if imports is not None:  # first: a patch that breaks an import
            element = case(f"imports.{version}", pid)
            if imports.status != "passed":
                tag = "failure" if imports.status == "failed" else "error"
                ET.SubElement(element, tag, message=imports.problem[:2000])
        proof = verdict.proof
        said = verdict.verdict
        element = case(f"proof.{version}", pid, proof.seconds if proof else 0.0)
        # The patch's one verdict, in the words of the text and JSON.
        properties = ET.SubElement(element, "properties")
        ET.SubElement(properties, "property", name="verdict", value=said.word)
        # Imports, fail-to-pass and tree tests have test cases of their own.
        own = [
            p
            for p in verdict.problems
            if not p.startswith(("fail-to-pass", "import stage", "release tests"))
            and "tree test(s)" not in p
        ]
        if own:
            # Partly proven: nothing failed, some of the fix was not shown.
            failed = not said.partial and (
                proof is not None and proof.status in ("failed", "passed")
            )
            message = said.text if said.partial else "; ".join(own)
            sub = ET.SubElement(
                element, "failure" if failed else "error", message=message[:2000]
            )
            sub.text = proof.message if proof else ""
        if verdict.pristine_state is not None and verdict.fail_to_pass:
            element = case(f"fail-to-pass.{version}", pid)
            if verdict.fail_to_pass in ("not-proven", "could-not-run"):
                # Could not run: no judgement either way, an error, not a failure.
                tag = "failure" if verdict.fail_to_pass == "not-proven" else "error"
                before = verdict.pristine_proof
                sub = ET.SubElement(
                    element,
                    tag,
                    message=f"pristine proof {before.status if before else 'not run'}",
                )
                sub.text = before.message if before else ""
        stage = verdict.release_tests
        if stage is not None:  # the release's tests of what it changes
            element = case(f"release-tests.{version}", pid, stage.seconds)
            if stage.problem:
                sub = ET.SubElement(element, "failure", message=stage.problem[:2000])
                sub.text = "\n".join(
                    f"{o.nodeid}: {o.reason}" for o in stage.pass_to_fail
                )
            elif not stage.ran:
                ET.SubElement(element, "skipped", message=stage.summary[:2000])
    for label, run in (("tree", report.cpu_tests), ("gpu", report.gpu.run)):
        if run is None:
            continue
        for test in run.cases:
            element = case(f"{label}.{test.classname}", test.name, test.seconds)
            if test.outcome in ("failed", "error", "skipped"):
                tag = {"failed": "failure"}.get(test.outcome, test.outcome)
                ET.SubElement(element, tag, message=test.message[:2000])
        if run.error:
            element = case(f"{label}.pytest", "run")
            ET.SubElement(element, "error", message=run.error[:2000])
    if report.gpu.requested and report.gpu.status == "skipped":
        element = case("gpu", "stage")
        ET.SubElement(element, "skipped", message=report.gpu.reason)
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    for tag, attr in (
        ("failure", "failures"),
        ("error", "errors"),
        ("skipped", "skipped"),
    ):
        suite.set(attr, str(sum(c.find(tag) is not None for c in cases)))
    ET.indent(suite)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        + ET.tostring(suite, encoding="unicode")
        + "\n"
    )

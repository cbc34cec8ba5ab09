"""Machine-readable validation reports for CI systems: JSON and JUnit XML. Lean: standard library only."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

from edgeopt import jsonio
from edgeopt.atomic import write_text
from edgeopt.device.validate import SCHEMA_VERSION, ValidationReport


def to_json(reports: list[ValidationReport]) -> str:
    """One report as an object, several as ``{"passed": ..., "reports": [...]}``."""
    if len(reports) == 1:
        return jsonio.dumps(reports[0].to_dict(), indent=2)
    return jsonio.dumps({"schema_version": SCHEMA_VERSION, "report": "validations",
                         "passed": all(r.passed for r in reports), "reports": [r.to_dict() for r in reports]}, indent=2)


def write_json(report: ValidationReport | list[ValidationReport], path: str) -> None:
    """Write the report(s) as JSON to ``path`` atomically, or to stdout when ``path`` is ``-``."""
    text = to_json(report if isinstance(report, list) else [report])
    if path == "-":
        sys.stdout.write(text + "\n")
    else:
        write_text(path, text + "\n")


def to_junit(reports: list[ValidationReport]) -> str:
    """A ``<testsuites>`` document: one suite per artifact, one test case per budget."""
    suites = ET.Element("testsuites", name="edgeopt validate")
    for report in reports:
        failures = sum(not check.passed for check in report.checks)
        skipped = sum(check.passed and check.status != "measured" for check in report.checks)
        suite = ET.SubElement(suites, "testsuite", name=f"{report.target or 'budgets'}: {report.artifact}",
                              tests=str(len(report.checks)), failures=str(failures), errors="0",
                              skipped=str(skipped),
                              time=f"{report.latency.mean_ms * report.latency.runs / 1000:.3f}",
                              hostname=report.host.get("cpu_model", ""))
        properties = ET.SubElement(suite, "properties")
        emulated = str(report.emulation_note is not None)
        for name, value in (("measured_with", report.measured_with()), ("emulated", emulated),
                            *(("note", note) for note in report.notes)):
            ET.SubElement(properties, "property", name=name, value=value)
        for check in report.checks:
            case = ET.SubElement(suite, "testcase", classname=f"edgeopt.validate.{report.target or 'budgets'}",
                                 name=check.name, time="0")
            measured = "not measured" if check.measured is None else f"{check.measured:.4g}{check.unit}"
            verdict = f"measured {measured}, budget {check.budget:.4g}{check.unit}"
            if check.status != "measured":  # emulated or unreliable: never a plain pass
                verdict += f" ({check.status}: {check.reason})"
            if not check.passed:
                failure = ET.SubElement(case, "failure", type="BudgetExceeded", message=f"{check.name}: {verdict}")
                failure.text = report.measured_with()
            elif check.status != "measured":
                ET.SubElement(case, "skipped", message=f"{check.verdict}: {verdict}")
            else:
                ET.SubElement(case, "system-out").text = verdict
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_junit(report: ValidationReport | list[ValidationReport], path: str) -> None:
    """Write JUnit XML to ``path`` (``-`` for stdout, like ``write_json``)."""
    text = to_junit(report if isinstance(report, list) else [report])
    if path == "-":
        sys.stdout.write(text)
    else:
        write_text(path, text)

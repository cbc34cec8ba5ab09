"""The fleet matrix report (``edgeopt fleet``) as markdown, HTML and JUnit XML, all read from its JSON form."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from html import escape

from edgeopt.reporting.markdown import _table

_CELL = {"found": "PASS", "budgets": "FAIL (budgets)", "quality": "FAIL (quality)", "unmeasured": "NO DEVICE FIGURES",
         "bad input": "BAD INPUT", "error": "ERROR"}


def cell(pair: dict) -> str:
    """A matrix cell: the verdict and the chosen candidate or the reason."""
    if not pair["chosen"]:
        return f"{_CELL[pair['verdict']]}: {pair['why']}"
    figures = pair["figures"]
    p50 = f", p50 {figures['p50_ms']:.3g} ms" if figures["p50_ms"] is not None else ""
    return f"{_CELL[pair['verdict']]}: {pair['chosen']} ({figures['file_bytes'] / 1e6:.3g} MB{p50})"


def matrix(report: dict) -> tuple[list[str], list[list[str]]]:
    by_pair = {(p["model"], p["target"]): p for p in report["pairs"]}
    rows = [[model] + [cell(by_pair[model, target]) for target in report["targets"]] for model in report["models"]]
    return ["model \\ target", *report["targets"]], rows


def summary_lines(report: dict) -> list[str]:
    """The final summary, readable from a CI log: one line per pair, then the totals and the exit code."""
    lines = []
    for pair in report["pairs"]:
        lines.append(f"{_CELL[pair['verdict']]:<17} {pair['model']} × {pair['target']}: {pair['why']}"
                     f" ({pair['seconds']:.1f} s, {pair['reused']}/{pair['candidates']} candidates from the cache)")
    passed = sum(p["verdict"] == "found" for p in report["pairs"])
    executor = report["executor"]
    lines.append(f"{passed}/{len(report['pairs'])} pairs pass; {report['seconds']:.1f} s on the {executor['name']} "
                 f"executor ({executor['nodes']} node(s), {executor['build_slots']} build slot(s)); "
                 f"{_slots_text(report)}; exit {report['exit_code']}")
    return lines


def _slots_text(report: dict) -> str:
    measures = sum(e["kind"] == "measure" for e in report["events"])
    builds = sum(e["kind"] == "build" for e in report["events"])
    held = "held" if report["slot_overlaps"] == 0 else f"VIOLATED {report['slot_overlaps']} time(s)"
    return f"{builds} builds, {measures} host measurements, measurement slots {held}"


def event_rows(report: dict) -> list[list[str]]:
    origin = min((e["start"] for e in report["events"]), default=0.0)
    return [[e["kind"], f"{e['pair']} / {e['candidate']}", f"{e['host']} ({e['node']}, pid {e['pid']})",
             f"+{e['start'] - origin:.2f}", f"{e['end'] - e['start']:.2f}", f"{e['waited_s']:.2f}",
             f"{e['load_1min']:.2f} on {e['cpus']} CPUs"] for e in report["events"]]


_EVENT_HEADERS = ["task", "pair / candidate", "where", "start s", "held s", "waited s", "load (1 min)"]


def _started(report: dict) -> str:
    first = min((e["start"] for e in report["events"]), default=None)
    return datetime.fromtimestamp(first, timezone.utc).isoformat(timespec="seconds") if first else "nothing ran"


def markdown(report: dict) -> str:
    headers, rows = matrix(report)
    lines = [f"# edgeopt fleet — {report['fleet']}", "", f"**{summary_lines(report)[-1]}**", "", "## Matrix", "",
             *_table(headers, rows), "", "## Pairs", ""]
    for pair in report["pairs"]:
        bundle = f", bundle `{pair['bundle']}`" if pair["bundle"] else ""
        where = f" → `{pair['out']}`{bundle}" if pair["out"] else ""
        lines.append(f"- **{pair['model']} × {pair['target']}**: {cell(pair)}{where}")
    lines += ["", "## Where and under what load each build and measurement ran", "",
              f"Times from the first task ({_started(report)}); measurements hold their machine alone "
              f"({_slots_text(report)}).", "", *_table(_EVENT_HEADERS, event_rows(report)), "",
              f"- **measuring**: {report['measuring']}", f"- **cache**: {report['cache']}",
              f"- **host**: {report['host'].get('cpu_model')}, {report['host'].get('usable_cpus')} CPUs"]
    return "\n".join(lines) + "\n"


_CSS = """body { font-family: system-ui, sans-serif; margin: 2em; color: #1f2328; }
table { border-collapse: collapse; font-size: .85em; } th, td { border: 1px solid #d0d7de; padding: 4px 8px;
text-align: left; vertical-align: top; } th { background: #f6f8fa; } td.found { background: #dafbe1; }
td.budgets, td.quality, td.error, td.unmeasured { background: #ffebe9; }"""


def html(report: dict) -> str:
    by_pair = {(p["model"], p["target"]): p for p in report["pairs"]}
    head = "".join(f"<th>{escape(t)}</th>" for t in ["model \\ target", *report["targets"]])
    body = "".join(
        f"<tr><th>{escape(model)}</th>" + "".join(
            f"<td class='{by_pair[model, t]['verdict'].replace(' ', '-')}'>{escape(cell(by_pair[model, t]))}</td>"
            for t in report["targets"]) + "</tr>" for model in report["models"])
    events = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in event_rows(report))
    title = f"edgeopt fleet — {escape(report['fleet'])}"
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style>"
            f"</head><body><h1>{title}</h1><p><b>{escape(summary_lines(report)[-1])}</b></p><h2>Matrix</h2>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<h2>Where and under what load each build and measurement ran</h2><p>Times from the first task "
            f"({escape(_started(report))}).</p><table><thead><tr>"
            + "".join(f"<th>{escape(h)}</th>" for h in _EVENT_HEADERS)
            + f"</tr></thead><tbody>{events}</tbody></table></body></html>\n")


def junit(report: dict) -> str:
    """One ``<testcase>`` per pair: a failure for budgets/quality/unmeasured, an error for bad input or a bug."""
    failures = sum(p["verdict"] in ("budgets", "quality", "unmeasured") for p in report["pairs"])
    errors = sum(p["verdict"] in ("bad input", "error") for p in report["pairs"])
    suites = ET.Element("testsuites", name="edgeopt fleet")
    suite = ET.SubElement(suites, "testsuite", name=f"edgeopt fleet {report['fleet']}",
                          tests=str(len(report["pairs"])), failures=str(failures), errors=str(errors), skipped="0",
                          time=f"{report['seconds']:.3f}", hostname=str(report["host"].get("cpu_model", "")))
    for pair in report["pairs"]:
        case = ET.SubElement(suite, "testcase", classname=f"edgeopt.fleet.{pair['model']}", name=pair["target"],
                             time=f"{pair['seconds']:.3f}")
        if pair["verdict"] == "found":
            ET.SubElement(case, "system-out").text = pair["why"]
        elif pair["verdict"] in ("bad input", "error"):
            ET.SubElement(case, "error", type=pair["verdict"], message=pair["why"])
        else:
            ET.SubElement(case, "failure", type=pair["verdict"], message=pair["why"])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"

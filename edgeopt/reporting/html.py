"""The optimize report as one self-contained HTML page (inline CSS, PNGs embedded as base64)."""

from __future__ import annotations

import base64
from html import escape

from edgeopt.reporting import tables

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #1f2328; max-width: 1400px; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #d0d7de; }
.verdict { padding: .8em 1em; border-radius: 6px; font-weight: 600; }
.found { background: #dafbe1; border: 1px solid #1a7f37; } .budgets, .quality { background: #ffebe9; border: 1px solid #cf222e; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; max-width: 22em;
         overflow-wrap: break-word; }
th { background: #f6f8fa; }
tr.chosen td { background: #dafbe1; font-weight: 600; } tr.closest td { background: #fff8c5; }
tr.skipped td { color: #656d76; }
.PASS { color: #1a7f37; font-weight: 600; } .FAIL { color: #cf222e; font-weight: 600; }
img { max-width: 100%; border: 1px solid #d0d7de; margin: .5em 0; }
dt { font-weight: 600; } dd { margin: 0 0 .5em 1.5em; }
"""


def render(report: dict, images: dict[str, bytes]) -> str:
    """``images`` maps a title to PNG bytes."""
    title = f"edgeopt optimize — {escape(report['target']['name'])}"
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{title}</h1>"]
    for section in tables.sections(report):
        if section.title:
            parts.append(f"<h2>{escape(section.title)}</h2>")
        if section.kind == "verdict":
            parts.append(f"<p class='verdict {report['verdict']}'>{escape(section.body)}</p>")
        elif section.kind == "text":
            parts.append(f"<p>{escape(section.body)}</p>")
        elif section.kind == "table":
            headers, rows, footnote = section.body
            parts.append(_table(headers, rows) + (f"<p>{escape(footnote)}</p>" if footnote else ""))
        elif section.kind == "figures":
            for name, png in images.items():
                data = base64.b64encode(png).decode("ascii")
                parts.append(f"<figure><img alt='{escape(name)}' src='data:image/png;base64,{data}'>"
                             f"<figcaption>{escape(name)}</figcaption></figure>")
        elif section.kind == "fields":
            parts.append("<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in section.body)
                         + "</dl>")
        elif section.kind == "list":
            parts.append("<ul>" + "".join(f"<li><b>{escape(label)}</b>: {escape(text)}</li>"
                                          for label, text in section.body) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _table(headers, rows: list[tables.Row]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(f"<tr class='{row.status}'>" + "".join(_cell(c) for c in tables.marked(row)) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(text: str) -> str:
    verdict = text.split(":")[0].split(" ")[0]
    css = f" class='{verdict}'" if verdict in ("PASS", "FAIL") else ""
    return f"<td{css}>{escape(text)}</td>"


def render_repair(repair: dict, chart: bytes | None) -> str:
    """The ``int8_repair`` decision of a compress run as one self-contained page: rungs, the operations left in
    float, the worst-layers chart and the ranking."""
    from edgeopt.sensitivity import format_noise_db

    rows = [[r["rung"], "PASS" if r["passed"] else "FAIL", r["check"], f"{r['seconds']:.1f} s"] for r in repair["rungs"]]
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>edgeopt int8 repair</title>"
             f"<style>{_CSS}</style></head><body><h1>edgeopt int8 repair</h1>",
             f"<p class='verdict {'found' if repair['passed_rung'] else 'quality'}'>"
             f"{escape('passed at rung ' + repair['passed_rung'] if repair['passed_rung'] else 'no rung passed')}; "
             f"{len(repair['float_ops'])} operation(s) in float ({repair['float_share']:.1%} of the quantized ones); "
             f"{escape('reproduce with ' + repair['recipe'] if repair['recipe'] else 'no one-step recipe')}</p>",
             "<h2>Rungs</h2>", _plain_table(["rung", "gate", "check", "time"], rows)]
    parts += ["<h2>Operations left in float</h2>", f"<p>{escape(repair['float_reason'])}</p>"]
    if repair["float_ops"]:
        parts += [_plain_table(
            ["rank", "operation", "type", "gain", "SQNR dB", "added noise dB", "range ratio", "clipped"],
            [[str(op["rank"]), _operation(op), op["op_type"], _figure(op["gain"]),
              ", ".join(f"{v:.1f}" for v in (op["sqnr_db"] or {}).values()) or "screened",
              format_noise_db(op["screen_noise_db"]), _figure(op["range_ratio"]), _figure(op["clipped"])]
             for op in repair["float_ops"]])]
    if chart:
        data = base64.b64encode(chart).decode("ascii")
        parts.append(f"<h2>Worst layers: why INT8 lost accuracy</h2><figure><img alt='worst layers' src='data:image/png;base64,{data}'>"
                     f"<figcaption>worst layers</figcaption></figure>")
    sensitivity = repair.get("sensitivity")
    if sensitivity:
        parts += [f"<h2>Sensitivity ({escape(sensitivity['method'])})</h2>", _plain_table(
            ["operation", "type", sensitivity["measure"], "gain", "screen gain", "output SQNR dB", "added noise dB",
             "range ratio", "clipped"],
            [[_operation(op), op["op_type"], _figure(op["score"]) if op["probed"] else "screened only",
              _figure(op["gain"]), _figure(op["screen_gain"]), _figure(op["screen_sqnr_db"]),
              format_noise_db(op["screen_noise_db"]),
              _figure(op["range_ratio"]), _figure(op["clipped"])] for op in sensitivity["ranked"]])]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _plain_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _operation(op: dict) -> str:
    """An operation's readable label, with the graph's name where they differ."""
    return op["name"] if op["label"] == op["name"] else f"{op['label']} ({op['name']})"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"

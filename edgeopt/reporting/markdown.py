"""The optimize report as markdown: pipe tables padded to line up, so it also reads well with ``cat``."""

from __future__ import annotations

from edgeopt.reporting import tables


def render(report: dict, images: dict[str, str]) -> str:
    """``images`` maps a title to a PNG file name beside the report."""
    lines = [f"# edgeopt optimize — {report['target']['name']}", "", f"**{tables.verdict(report)}**", ""]
    if report.get("chosen_files"):
        lines += ["Chosen artifact (beside this report): " + ", ".join(f"`{f}`" for f in report["chosen_files"]), ""]
    lines += [f"Stages run: {' → '.join(report['stages_run'])}", "", "## Candidates", ""]
    rows = tables.candidate_rows(report)
    lines += _table(tables.CANDIDATE_HEADERS, [_mark(r) for r in rows])
    lines += ["", "★ chosen · ◆ closest (no candidate passed). Sizes in decimal KB/MB; latency in ms, batch 1.", "",
              "## Budgets per candidate", ""]
    lines += _table(tables.budget_headers(report), [r.cells for r in tables.budget_rows(report)])
    lines += ["", "## Plots", ""]
    lines += [f"![{title}]({name})" for title, name in images.items()] or ["(nothing was measured)"]
    lines += ["", "## How it was measured", ""]
    lines += [f"- **{key}**: {value}" for key, value in tables.settings_lines(report)]
    notes = [f"- {c['label']}: {note}" for c in report["candidates"] for note in c["notes"]]
    if notes:
        lines += ["", "## Notes", "", *notes]
    return "\n".join(lines) + "\n"


def _mark(row: tables.Row) -> tuple[str, ...]:
    prefix = {"chosen": "★ ", "closest": "◆ "}.get(row.status, "")
    return (row.cells[0], prefix + row.cells[1], *row.cells[2:])


def _table(headers, rows) -> list[str]:
    cells = [list(headers)] + [[str(c).replace("|", "\\|") for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    out.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return out

"""The optimize report as markdown: pipe tables padded to line up, so it also reads well with ``cat``."""

from __future__ import annotations

from edgeopt.reporting import tables


def render(report: dict, images: dict[str, str]) -> str:
    """``images`` maps a title to a PNG file name beside the report."""
    lines = [f"# edgeopt optimize — {report['target']['name']}", ""]
    for section in tables.sections(report):
        if section.title:
            lines += [f"## {section.title}", ""]
        if section.kind == "verdict":
            lines += [f"**{section.body}**", ""]
        elif section.kind == "text":
            lines += [section.body, ""]
        elif section.kind == "table":
            headers, rows, footnote = section.body
            lines += _table(headers, [tables.marked(r) for r in rows]) + [""] + ([footnote, ""] if footnote else [])
        elif section.kind == "figures":
            lines += [f"![{title}]({name})" for title, name in images.items()] or ["(nothing was measured)"]
            lines += [""]
        elif section.kind == "fields":
            lines += [f"- **{key}**: {value}" for key, value in section.body] + [""]
        elif section.kind == "list":
            lines += [f"- {label}: {text}" for label, text in section.body] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _table(headers, rows) -> list[str]:
    cells = [list(headers)] + [[str(c).replace("|", "\\|") for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    out.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return out

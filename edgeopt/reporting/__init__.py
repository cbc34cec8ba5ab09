"""Reports of ``edgeopt optimize``: JSON, markdown (terminal-readable) and HTML, with matplotlib figures."""

from __future__ import annotations

from pathlib import Path

from edgeopt import atomic, jsonio


def write_reports(report: dict, folder: Path) -> list[Path]:
    """Write report.json, report.md, report.html and the PNG figures into ``folder`` (each atomically)."""
    from edgeopt.reporting import html, markdown, plots

    figures = {"latency histograms": ("latency.png", plots.latency_histograms(report)),
               "size vs latency vs accuracy": ("tradeoff.png", plots.tradeoff(report)),
               "Pareto front": ("pareto.png", plots.pareto_front(report))}
    repaired = next((c for c in report["candidates"] if c.get("repair")), None)
    if repaired:  # why INT8 lost accuracy, from the repair ladder's sensitivity analysis
        figures[f"worst layers ({repaired['label']})"] = ("worst_layers.png", plots.worst_layers(repaired["repair"]))
    figures = {title: (name, png) for title, (name, png) in figures.items() if png}
    written = []
    for name, png in figures.values():
        with atomic.atomic_file(folder / name) as handle:
            handle.write(png)
        written.append(folder / name)
    texts = {"report.json": jsonio.dumps(report, indent=2),
             "report.md": markdown.render(report, {title: name for title, (name, _) in figures.items()}),
             "report.html": html.render(report, {title: png for title, (_, png) in figures.items()})}
    for name, text in texts.items():
        atomic.write_text(folder / name, text)
        written.append(folder / name)
    return written

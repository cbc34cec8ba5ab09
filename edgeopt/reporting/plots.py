"""The optimize report's figures (matplotlib, Agg backend, PNG bytes): latency histograms and the trade-off."""

from __future__ import annotations

import io
import textwrap

import numpy as np

_COLOURS = {"chosen": "#1a7f37", "closest": "#bf8700", "pass": "#2da44e", "fail": "#cf222e"}


def latency_histograms(report: dict) -> bytes | None:
    """One histogram per measured candidate (shared log-scale x), with p50/p95/p99 and the p50 budget."""
    measured = [c for c in report["candidates"] if c["timings_ms"]]
    if not measured:
        return None
    plt = _pyplot()
    every = np.concatenate([np.asarray(c["timings_ms"]) for c in measured])
    low, high = max(every.min(), 1e-4), max(every.max(), every.min() * 1.01)
    bins = np.geomspace(low * 0.95, high * 1.05, 50)
    budget = report["target"]["budgets"].get("p50_ms")
    fig, axes = plt.subplots(len(measured), 1, figsize=(9, 1.7 * len(measured) + 0.9), sharex=True, squeeze=False)
    for ax, c in zip(axes[:, 0], measured):
        status = _status(report, c)
        ax.hist(c["timings_ms"], bins=bins, color=_COLOURS[status], alpha=0.8)
        lat = c["latency_ms"]
        for name, style in (("p50_ms", "-"), ("p95_ms", "--"), ("p99_ms", ":")):
            ax.axvline(lat[name], color="black", linestyle=style, linewidth=1, label=name.replace("_ms", ""))
        if budget and bins[0] <= budget <= bins[-1]:
            ax.axvline(budget, color="#cf222e", linewidth=2, label="p50 budget")
        ax.set_ylabel("runs")
        ax.set_title(f"{c['label']} ({c.get('built_precision') or c['precision']}): p50 {lat['p50_ms']:.3g} ms, p99 {lat['p99_ms']:.3g} ms, "
                     f"{lat['runs']} runs — {status.upper()}", fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xscale("log")
    axes[-1, 0].set_xlabel("latency per inference, ms (batch 1, log scale)")
    fig.suptitle(_caption(report), fontsize=7, y=0.995)
    return _png(fig, plt)


def tradeoff(report: dict) -> bytes | None:
    """p50 latency vs quality loss (the task metric's drop when the gate has one, else top-1 drop or 1 − cosine);
    marker area ∝ file size; colour = verdict."""
    measured = [c for c in report["candidates"] if c["latency_ms"]]
    if not measured:
        return None
    plt = _pyplot()
    metric = all(c["quality"].get("metric") is not None for c in measured)
    labelled = not metric and all(c["quality"]["top1_drop"] is not None for c in measured)
    fig, ax = plt.subplots(figsize=(8, 5))
    biggest = max(c["file_bytes"] for c in measured)
    for index, c in enumerate(measured):
        x = c["latency_ms"]["p50_ms"]
        y = (c["quality"]["metric"]["drop"] if metric else c["quality"]["top1_drop"] * 100 if labelled
             else 1 - c["quality"]["cosine"])
        status = _status(report, c)
        ax.scatter([x], [y], s=60 + 900 * c["file_bytes"] / biggest, color=_COLOURS[status], alpha=0.6,
                   edgecolors="black")
        ax.annotate(f"{c['label']}\n{c['file_bytes'] / 1e6:.3g} MB, {status}", (x, y), fontsize=8,
                    xytext=(8, 8 if index % 2 == 0 else -24), textcoords="offset points")  # alternate: no overlap
    gate = (measured[0]["quality"]["metric"]["threshold"] if metric else report["gate"]["max_top1_drop"] * 100
            if labelled else 1 - report["gate"]["min_cosine"])
    ax.axhline(gate, color="#cf222e", linestyle="--", linewidth=1, label="quality gate")
    budget = report["target"]["budgets"].get("p50_ms")
    xs = [c["latency_ms"]["p50_ms"] for c in measured]
    if budget and min(xs) / 10 <= budget <= max(xs) * 10:
        ax.axvline(budget, color="#cf222e", linewidth=1, label="p50 budget")
    ax.set_xscale("log")
    ax.set_xlabel("p50 latency, ms (batch 1, log scale)")
    ax.set_ylabel(f"{measured[0]['quality']['metric']['primary']} drop (task metric)" if metric
                  else "top-1 drop, percentage points" if labelled else "1 − cosine to the original")
    ax.set_title("size (marker area) vs latency vs accuracy", fontsize=10)
    ax.legend(fontsize=8)
    ax.margins(0.25)
    fig.suptitle(_caption(report), fontsize=7, y=0.995)
    return _png(fig, plt)


def worst_layers(repair: dict, count: int = 15) -> bytes | None:
    """Horizontal bars: the ``count`` most sensitive quantized operations of an ``int8_repair`` decision, by how
    much keeping each alone in float recovers the gate's figure; operations the repair left in float in green."""
    sensitivity = repair.get("sensitivity")
    if not sensitivity or not sensitivity["probed"]:
        return None
    plt = _pyplot()
    ranked = [op for op in sensitivity["ranked"] if op["probed"]][:count][::-1]  # most sensitive at the top
    kept = {op["name"] for op in repair["float_ops"]}
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(ranked) + 1.6))
    ax.barh([textwrap.shorten(op["label"], 60, placeholder="…") for op in ranked], [op["gain"] for op in ranked],
            color=[_COLOURS["chosen"] if op["name"] in kept else "#8c959f" for op in ranked])
    for y, op in enumerate(ranked):
        ratio = f", range ×{op['range_ratio']:.3g}" if op["range_ratio"] is not None else ""
        ax.annotate(f" {op['op_type']}{ratio}", (max(op["gain"], 0), y), va="center", fontsize=7)
    ax.set_xlabel(f"{sensitivity['measure']} recovered by keeping only this operation in float "
                  f"(INT8: {sensitivity['int8_score']:.4g}; {sensitivity['samples']} samples; the worst "
                  f"{sensitivity['probed']} of {len(sensitivity['ranked'])} by the one-pass screen)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    kept_note = ("green: kept in float by the repair" if kept
                 else f"none kept in float: passed at rung {repair['passed_rung']}" if repair["passed_rung"]
                 else "none kept in float")
    ax.set_title(f"worst layers of {sensitivity['quantized_ops']} quantized operations of the "
                 f"{sensitivity['model']} model ({kept_note})", fontsize=9, loc="left")
    gains = [op["gain"] for op in ranked]
    low, high = min(0.0, *gains), max(0.0, *gains)
    span = (high - low) or 1e-6
    ax.set_xlim(low - 0.05 * span, high + 0.5 * span)  # room for the labels right of the bars
    return _png(fig, plt)


def pareto_front(report: dict) -> bytes | None:
    """The Pareto search's trials in two panels: latency vs file size (colour = quality loss) and latency vs
    quality loss; the front joined by a step line, infeasible trials hollow, the chosen one starred, and the
    budget and gate lines."""
    pareto = report.get("pareto")
    rows = [r for r in (pareto or {}).get("trials", []) if r["values"]]
    if not rows:
        return None
    plt = _pyplot()
    latency, _, quality = pareto["objectives"]
    scale = 100 if quality == "top1_drop" else 1
    quality_label = {"top1_drop": "top-1 drop, pp", "metric_drop": "task metric drop (towards worse)"}.get(
        quality, "1 − cosine to the original")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    losses = [r["values"][2] * scale for r in rows]
    norm = plt.Normalize(min(losses), max(max(losses), min(losses) + 1e-9))
    front = sorted((r for r in rows if r["on_front"]), key=lambda r: r["values"][0])
    for ax, y_index, y_scale in ((left, 1, 1), (right, 2, scale)):
        for r in rows:
            x, y = r["values"][0], r["values"][y_index] * y_scale
            colour = plt.cm.viridis(norm(r["values"][2] * scale))
            ax.scatter([x], [y], s=70, marker="o", color=colour if r["feasible"] else "none",
                       edgecolors=colour if not r["feasible"] else "black", linewidths=1.5, zorder=3)
            ax.annotate(r["label"], (x, y), fontsize=6, xytext=(4, -9), textcoords="offset points", color="#57606a")
            if r["label"] == report["chosen"]:
                ax.scatter([x], [y], s=420, marker="*", color="none", edgecolors=_COLOURS["chosen"], linewidths=2,
                           zorder=4, label=f"chosen: {r['label']}")
                ax.annotate(r["recipe"], (x, y), fontsize=7, xytext=(10, 10), textcoords="offset points")
        if front:
            ax.step([r["values"][0] for r in front], [r["values"][y_index] * y_scale for r in front], where="post",
                    color="#57606a", linewidth=1, zorder=2, label="Pareto front (feasible)")
        ax.set_xscale("log")
        ax.set_xlabel(f"{latency.replace('_ms', '')} latency, ms (batch 1, log scale)")
    budgets = report["target"]["budgets"]
    for ax in (left, right):
        if budgets.get(latency) is not None:
            ax.axvline(budgets[latency], color="#cf222e", linewidth=1, linestyle="--", label=f"{latency} budget")
    if budgets.get("max_file_mb") is not None:
        left.axhline(budgets["max_file_mb"], color="#cf222e", linewidth=1, linestyle=":", label="max_file_mb budget")
    gate = (report["gate"]["max_top1_drop"] * 100 if quality == "top1_drop" else
            None if quality == "metric_drop" else 1 - report["gate"]["min_cosine"])  # a metric's bound is relative
    if gate is not None:
        right.axhline(gate, color="#cf222e", linewidth=1, linestyle=":", label="quality gate")
    left.set_yscale("log")
    left.set_ylabel("file size, MB (log scale)")
    right.set_ylabel(quality_label)
    left.set_title("latency vs size (colour: quality loss; hollow: infeasible)", fontsize=9)
    right.set_title("latency vs quality", fontsize=9)
    colourbar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap="viridis"), ax=right)
    colourbar.set_label(quality_label, fontsize=8)
    for ax in (left, right):
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(_caption(report), fontsize=7, y=0.995)
    return _png(fig, plt)


def _status(report: dict, c: dict) -> str:
    if c["label"] == report["chosen"]:
        return "chosen"
    if c["label"] == report["closest"]:
        return "closest"
    return "pass" if c["passed"] else "fail"


def _caption(report: dict) -> str:
    where = report["emulation_note"] or f"on the device ({report['host']['cpu_model']})"
    return textwrap.fill(f"{report['target']['name']}: {where}", 130)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig, plt) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()

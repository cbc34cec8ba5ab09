"""The optimize report's content as plain strings (verdict, tables, settings), shared by every renderer.

Everything is read from the report's JSON form (``OptimizeResult.describe()`` plus ``chosen_files``), so the
console, markdown and HTML always say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeopt.device.budgets import BUDGET_FIELDS
from edgeopt.optimization.candidate import TIE_TOLERANCE, build_failures

CANDIDATE_HEADERS = ("stage", "candidate", "precision", "recipe", "size", "p50 ms", "p95 ms", "p99 ms", "CV",
                     "peak RSS", "quality vs original", "quality gate", "budgets", "cache")


@dataclass(frozen=True)
class Row:
    cells: tuple[str, ...]
    status: str  # chosen | closest | pass | fail | skipped


def verdict(report: dict) -> str:
    target = report["target"]["name"]
    if report["verdict"] == "found":
        chosen = _by_label(report, report["chosen"])
        return (f"FOUND: {chosen['label']} ({chosen['recipe']}, stage '{chosen['stage']}') meets every budget of "
                f"{target} and the quality gate; lowest {report['objective']} among the passing candidates "
                f"(within {TIE_TOLERANCE:.0%} is a tie, won by the smaller file)")
    if report["verdict"] == "budgets":
        closest = _by_label(report, report["closest"])
        return (f"NO CANDIDATE MEETS EVERY BUDGET of {target}; closest: {closest['label']} ({closest['recipe']}), "
                f"failing {failing_text(closest)}")
    if report["verdict"] == "unbuilt":
        reasons = build_failures(c["skipped"] for c in report["candidates"])
        return f"NO CANDIDATE COULD BE BUILT for {target}: " + " | ".join(reasons)
    return f"NO CANDIDATE PASSES THE QUALITY GATE for {target}"


def failing_text(candidate: dict) -> str:
    if not candidate["checks"]:
        return candidate["skipped"] or "not measured"
    return ", ".join(f"{c['name']} ({_num(c['measured'])} > {_num(c['budget'])}{' ' + c['unit'] if c['unit'] else ''})"
                     for c in candidate["checks"] if not c["passed"]) or "none"


def candidate_rows(report: dict) -> list[Row]:
    rows = []
    for c in report["candidates"]:
        fig, quality = c["figures"], c["quality"]
        if c["skipped"]:
            cells = (c["stage"], c["label"], c["precision"], c["recipe"], *["-"] * 7, "-", f"skipped: {c['skipped']}",
                     "-")
            rows.append(Row(cells, "skipped"))
            continue
        drop, metric = quality["top1_drop"], quality.get("metric")
        quality_text = (f"{metric['primary']} drop {metric['drop']:+.4g} (towards worse)" if metric is not None
                        else f"top-1 drop {drop * 100:+.2f} pp" if drop is not None
                        else f"cosine {quality['cosine']:.4f}" if quality["cosine"] is not None else "-")
        emulated = any(ch.get("status", "measured") != "measured" for ch in c["checks"])
        budgets = (("EMULATED" if emulated else "PASS") if c["budgets_passed"] else "FAIL: " + ", ".join(
            ch["name"] for ch in c["checks"] if not ch["passed"])) if c["checks"] else "not measured"
        if not c["eligible"]:
            budgets += f" (device does not run {c['precision']})"
        cache = "reused" if c["reused"]["artifact"] and c["reused"]["measurement"] else (
            "built" if not c["reused"]["artifact"] else "re-measured")
        cells = (c["stage"], c["label"], c.get("built_precision") or c["precision"], c["recipe"], size_text(c["file_bytes"]),
                 _num(fig.get("p50_ms")), _num(fig.get("p95_ms")), _num(fig.get("p99_ms")), _num(fig.get("cv"), 3),
                 f"{fig['peak_rss_mb']:.0f} MB" if fig.get("peak_rss_mb") else "-", quality_text,
                 "PASS" if quality["gate_passed"] else "FAIL", budgets, cache)
        status = ("chosen" if c["label"] == report["chosen"] else "closest" if c["label"] == report["closest"]
                  else "pass" if c["passed"] else "fail")
        rows.append(Row(cells, status))
    return rows


def budget_headers(report: dict) -> tuple[str, ...]:
    budgets = report["target"]["budgets"]
    return ("candidate", *(f"{name} ≤ {_num(value)}{' ' + BUDGET_FIELDS[name][1] if BUDGET_FIELDS[name][1] else ''}"
                           for name, value in budgets.items()))


def budget_rows(report: dict) -> list[Row]:
    """PASS/FAIL with the measured figure, per measured candidate and budget."""
    rows = []
    for c in report["candidates"]:
        if not c["checks"]:
            continue
        cells = tuple(f"{ch.get('verdict') or ('PASS' if ch['passed'] else 'FAIL')} {_num(ch['measured'])}"
                      for ch in c["checks"])
        rows.append(Row((c["label"], *cells), "pass" if c["budgets_passed"] else "fail"))
    return rows


def settings_lines(report: dict) -> list[tuple[str, str]]:
    """How every figure was measured, and on what."""
    target, host, measuring = report["target"], report["host"], report["measuring"]
    measured = next((c for c in report["candidates"] if c["measured_with"]), None)
    runtime = target["runtime"]
    lines = [
        ("device profile", f"{target['name']}: {target['description']}"),
        ("device", f"{target['device']['name']} ({target['device']['cpu']})"),
        ("precisions the device runs", ", ".join(target["precisions"])),
        ("runtime settings (profile)", f"{runtime['runtime']}, threads={runtime['threads']}, "
                                       f"streams={runtime['streams']}, hint={runtime['performance_hint']}, "
                                       f"inference precision={runtime['inference_precision']}"),
        ("measurement", f"at least {measuring['runs']} timed runs (and {measuring['min_seconds']} s) after "
                        f"{measuring['warmup']} warm-up, batch 1, in a separate process per candidate"),
    ]
    if measured:
        lines.append((f"measured with ({measured['label']}; each candidate's own line is in report.json)",
                      measured["measured_with"]))
    lines += [
        ("where", report["emulation_note"] or (
            "on the devices " + ", ".join(f"{d['device']} ({d['address']}, {d['identity']})" for d in report["devices"])
            if report.get("devices") else f"on the device itself ({host['cpu_model']})")),
        ("host", f"{host['cpu_model']}, {host['usable_cpus']} usable CPUs, {host['os']}, {host['machine']}, "
                 f"flags {' '.join(host['cpu_flags']) or 'none'}"),
        ("quality gate", _gate_text(report["gate"])),
        ("objective", f"lowest {report['objective']} among passing candidates (within 3% counts as a tie; "
                      f"ties go to the smaller file)"),
        ("versions", ", ".join(f"{k} {v}" for k, v in report["versions"].items())),
        ("cache", report["cache"]),
        ("search plan", report["plan"]),
    ]
    return lines


def size_text(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count / 1e6:.2f} MB" if count >= 1e6 else f"{count / 1e3:.1f} KB"


def _by_label(report: dict, label: str) -> dict:
    return next(c for c in report["candidates"] if c["label"] == label)


def _num(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


@dataclass(frozen=True)
class Section:
    """One part of the optimize report, in the order every renderer shows it.

    ``kind`` says how to lay ``body`` out: ``verdict`` (str), ``text`` (str), ``table`` ((headers, rows,
    footnote)), ``figures`` (None: the renderer has the images), ``fields`` ([(key, value)]), ``list``
    ([(label, text)]). ``console`` marks the sections the terminal summary prints too.
    """

    key: str
    title: str | None
    kind: str
    body: object
    console: bool = False


MARKS = {"chosen": "★ ", "closest": "◆ "}


def sections(report: dict) -> list[Section]:
    """The optimize report's sections, in order: the one layout of the HTML, markdown and console reports."""
    out = [Section("verdict", None, "verdict", verdict(report), console=True)]
    if report.get("chosen_files"):
        out.append(Section("chosen", None, "text",
                           "Chosen artifact (beside this report): " + ", ".join(report["chosen_files"])))
    out.append(Section("stages", None, "text", f"Stages run: {' → '.join(report['stages_run'])}"))
    out.append(Section("candidates", "Candidates", "table",
                       (CANDIDATE_HEADERS, candidate_rows(report), "★ chosen · ◆ closest (no candidate passed). "
                        "Sizes in decimal KB/MB; latency in ms, batch 1."), console=True))
    if report.get("pareto"):
        out += pareto_sections(report)
    out.append(Section("budgets", "Budgets per candidate", "table",
                       (budget_headers(report), budget_rows(report), None)))
    out.append(Section("plots", "Plots", "figures", None))
    measured = settings_lines(report)
    out.append(Section("measured", "How it was measured", "fields", measured, console=True))
    notes = [(c["label"], note) for c in report["candidates"] for note in c["notes"]]
    if notes:
        out.append(Section("notes", "Notes", "list", notes))
    return out


PARETO_HEADERS = ("#", "trial", "recipe", "latency ms", "size", "quality loss", "feasible", "front", "cache")


def pareto_sections(report: dict) -> list[Section]:
    """The Pareto search: how it searched (console too) and every trial with its objectives and feasibility."""
    pareto = report["pareto"]
    latency, _, quality = pareto["objectives"]
    lines = [("sampler", f"Optuna {pareto['sampler']}, seed {pareto['seed']}, {pareto['trials_budget']} trials "
                         f"({pareto['trials_resumed']} from the stored study)"),
             ("objectives (minimised)", f"{latency}, file size (MB), {quality}; constrained by every budget of "
                                        f"the profile and the quality gate"),
             ("searched", "; ".join(f"{name} {values}" for name, values in pareto["space"].items())),
             ("not searched", "; ".join(pareto["not_searched"])),
             ("Pareto front (feasible, non-dominated)", ", ".join(pareto["front"]) or "empty: no trial is feasible"),
             ("study", pareto["storage"])]
    rows = []
    for t in pareto["trials"]:
        values = t["values"]
        failing = [name for name, value in (t["constraints"] or {}).items() if value > 0]
        feasible = "yes" if t["feasible"] else (f"no: {', '.join(failing)}" if failing else
                                                f"no: {t['skipped'] or 'not eligible'}")
        loss = "-" if not values else (f"{values[2] * 100:+.2f} pp" if quality == "top1_drop" else f"{values[2]:.2e}")
        cache = "reused" if t["reused"]["artifact"] and t["reused"]["measurement"] else (
            "built" if not t["reused"]["artifact"] else "re-measured")
        status = ("chosen" if t["label"] == report["chosen"] else "pass" if t["feasible"]
                  else "skipped" if t["skipped"] else "fail")
        rows.append(Row((str(t["number"]), t["label"], t["recipe"], _num(values[0]) if values else "-",
                         size_text(round(values[1] * 1e6)) if values else "-", loss, feasible,
                         "●" if t["on_front"] else "", cache), status))
    return [Section("pareto", "Pareto search", "fields", lines, console=True),
            Section("pareto_trials", "Pareto trials", "table",
                    (PARETO_HEADERS, rows, "★ chosen (lowest objective among feasible trials, as the staged plan "
                                           "chooses) · ● on the Pareto front"))]


def marked(row: Row) -> tuple[str, ...]:
    """The row's cells with the chosen / closest mark before the candidate's label."""
    return (row.cells[0], MARKS.get(row.status, "") + row.cells[1], *row.cells[2:])


def _gate_text(gate: dict) -> str:
    metric = gate.get("metric")
    if metric is not None:
        allowed = " and ".join(text for text in (
            f"{metric['max_drop']:.4g}" if metric["max_drop"] is not None else None,
            f"{metric['max_rel_drop'] * 100:.3g}% of the original's" if metric["max_rel_drop"] is not None else None)
            if text)
        return (f"task metric {metric['name']}: {metric['primary']} ({metric['direction']} is better) may drop by at "
                f"most {allowed} on the evaluation set")
    return (f"top-1 drop ≤ {gate['max_top1_drop'] * 100:.2f} pp on the evaluation set "
            f"(without labels: cosine to the original ≥ {gate['min_cosine']})")

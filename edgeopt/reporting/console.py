"""Everything edgeopt prints: rich tables for people (plain text when stdout is not a terminal), progress on
stderr, and JSON for machines (``emit``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

PIPE_WIDTH = 160  # columns of the tables written to a pipe or a log
_STYLE = {"chosen": "bold green", "closest": "bold yellow", "pass": "green", "fail": "red", "skipped": "dim"}


def emit(data: dict, show: str | Callable[[], None], json_out: str | None, quiet: bool) -> None:
    """JSON to a file or alone on stdout (``-``); otherwise ``show`` (a line, or a printer) unless quiet."""
    from edgeopt import atomic, jsonio

    if json_out == "-":
        click.echo(jsonio.dumps(data, indent=2))
    elif json_out:
        atomic.write_text(json_out, jsonio.dumps(data, indent=2) + "\n")
    if not quiet and json_out != "-":
        show() if callable(show) else click.echo(show)


def console() -> Console:
    """Tables for people: the terminal's width, or ``PIPE_WIDTH`` when stdout is a pipe or a log (``COLUMNS``
    sets it), where rich would cut names and wrap budget rows at its default of 80."""
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=False, highlight=False, soft_wrap=True, width=PIPE_WIDTH if piped else None)


def format_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def size_ratio(reference: int, size: int) -> str:
    """``3.51x smaller`` / ``1.02x larger``: how ``size`` compares with ``reference``."""
    return f"{reference / size:.2f}x smaller" if size <= reference else f"{size / reference:.2f}x larger"


def print_compress_result(result) -> None:
    out = console()
    out.print(escape(f"recipe: {result.recipe.describe()}"))
    for note in result.notes:
        out.print(escape(f"  {note}"))  # names and "[runtime]" are text, not markup
    table = Table(title=escape(f"artifacts in {result.out}"))
    for column in ("model", "precision", "size", "vs FP32", "top-1", "cosine", "quality gate"):
        table.add_column(column)
    reference = result.reference
    if result.fp32_ir_bytes:
        top1 = f"{reference.top1 * 100:.2f}%" if reference and reference.top1 is not None else "-"
        table.add_row("original (FP32 IR)", "fp32", format_bytes(result.fp32_ir_bytes), "1.00x", top1, "1", "reference")
    for artifact in result.artifacts:
        quality = result.qualities.get(artifact.format)
        top1 = f"{quality.top1 * 100:.2f}%" if quality and quality.top1 is not None else "-"
        cosine = f"{quality.fidelity.cosine:.5f}" if quality and quality.fidelity else "-"
        versus = result.vs_fp32.get(artifact.format)  # the FP32 model in the artifact's own format
        ratio = (size_ratio(versus.fp32_bytes, artifact.bytes) + f" ({artifact.format})" if versus else
                 size_ratio(result.fp32_ir_bytes, artifact.bytes) + " (IR)" if result.fp32_ir_bytes else "-")
        gate = result.gate_results.get(artifact.format)
        verdict = "-" if gate is None else ("PASS: " if gate[0] else "FAIL: ") + gate[1]
        table.add_row(artifact.path.name, artifact.precision, format_bytes(artifact.bytes), ratio, top1, cosine,
                      escape(verdict))
    out.print(table)
    print_output_fidelity(result, out)
    for fmt, versus in result.vs_fp32.items():
        flags = f" -- FLAGGED: {', '.join(versus.flags)}" if versus.flags else ""
        out.print(f"{fmt} vs FP32 {fmt} ({versus.settings.runtime}, {versus.settings.threads} threads): "
                  f"{versus.summary()}{flags}")
    fp32_weights = result.fp32_weight_bytes
    for fmt, weights in result.weight_bytes.items():
        ratio = f", {size_ratio(fp32_weights.total, weights.total)} than FP32 ({format_bytes(fp32_weights.total)})" \
            if fp32_weights and fp32_weights.total and weights.total else ""  # 0: weights inside If bodies
        out.print(f"weight bytes ({fmt}): {format_bytes(weights.total)}{ratio}")
    if result.steps is not None:
        print_step_report(result.steps, out)
    if "int8_repair" in result.decisions:
        print_repair(result.decisions["int8_repair"], out)
    for validation in result.validations:  # the artifacts the target runs, against its budgets
        print_validation(validation)


def print_repair(repair: dict, out: Console, count: int = 10) -> None:
    """The repair ladder's rungs and the most sensitive operations (those left in float marked)."""
    from edgeopt.sensitivity import format_noise_db

    table = Table(title="int8 repair: rungs", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("rung", "gate", "check", "s"):
        table.add_column(column)
    for rung in repair["rungs"]:
        table.add_row(rung["rung"], "PASS" if rung["passed"] else "FAIL", rung["check"], f"{rung['seconds']:.1f}")
    out.print(table)
    sensitivity = repair.get("sensitivity")
    if sensitivity:
        kept = {op["name"] for op in repair["float_ops"]}
        table = Table(title=f"why INT8 lost accuracy: most sensitive of {sensitivity['quantized_ops']} quantized "
                            f"operations of the {sensitivity['model']} model (each switched to float in one "
                            f"emulating model, gain in brackets; the worst {sensitivity['probed']} kept alone in "
                            f"float in the INT8 model; INT8 {sensitivity['measure']} "
                            f"{sensitivity['int8_score']:.4f}; {sensitivity['seconds']:.1f} s)",
                      box=box.SIMPLE_HEAD, pad_edge=False)
        for column in ("#", "operation", "type", "gain", "worst SQNR dB", "added noise dB", "range ratio", "clipped",
                       "float"):
            table.add_column(column, max_width=48 if column == "operation" else None, overflow="fold")
        for rank, op in enumerate(sensitivity["ranked"][:count], 1):
            table.add_row(str(rank), escape(op["label"]), op["op_type"],
                          f"({op['screen_gain']:+.4f})" if op["gain"] is None else f"{op['gain']:+.4f}",
                          f"{min(op['sqnr_db'].values()):.1f}" if op["sqnr_db"] else "-",
                          format_noise_db(op["screen_noise_db"]),
                          "-" if op["range_ratio"] is None else f"{op['range_ratio']:.3g}",
                          "-" if op["clipped"] is None else f"{op['clipped']:.2%}", "yes" if op["name"] in kept else "")
        Console(highlight=False, width=max(out.width, 130)).print(table)
    passed = f"passed at rung {repair['passed_rung']}" if repair["passed_rung"] else "no rung passed"
    out.print(escape(f"int8 repair: {passed}, {len(repair['float_ops'])} operation(s) in float "
                     f"({repair['float_share']:.1%}); one-step recipe: "
                     f"{repair['recipe'] or 'none (' + (repair['no_recipe'] or 'no rung passed') + ')'}"))
    if repair["float_reason"]:
        out.print(escape(f"in float: {repair['float_reason']}"))


def print_output_fidelity(result, out: Console) -> None:
    """One row per artifact and output, for models with more than one output; gated outputs are marked."""
    qualities = {name: q for name, q in result.qualities.items() if len(q.outputs) > 1}
    if not qualities:
        return
    table = Table(title="fidelity per output", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("artifact", "output", "gated", "cosine", "max abs err", "mean abs err", "top-1 agree"):
        table.add_column(column, justify="left" if column in ("artifact", "output", "gated") else "right",
                         no_wrap=column != "output", overflow="fold")  # a long output name wraps, never cut
    for name, quality in qualities.items():
        gated = {f.output for f in result.gate.gated(quality)}
        for fidelity in quality.outputs:
            agreement = "-" if fidelity.top1_agreement is None else f"{fidelity.top1_agreement * 100:.2f}%"
            table.add_row(name, escape(fidelity.output), "yes" if fidelity.output in gated else "no",
                          f"{fidelity.cosine:.5f}", f"{fidelity.max_abs_error:.4g}", f"{fidelity.mean_abs_error:.4g}",
                          agreement)
    Console(highlight=False, width=max(out.width, 110)).print(table)  # output names: never squeeze into 80


def print_step_report(report, out: Console) -> None:
    """One row per recipe step: what it cost and what it bought; "smaller" and "faster" compare with the original."""
    how = report.describe()["measured_with"]
    table = Table(title="after each step", box=box.SIMPLE_HEAD, pad_edge=False)
    metric = report.metric.primary if report.metric else None  # the gate's task metric, when it has one
    for column in ("step", "prec", "params", "MACs", "IR size", "smaller", "top-1", *([metric] if metric else ()),
                   "cosine", "p50 ms", "faster"):
        table.add_column(column, justify="left" if column in ("step", "prec") else "right", no_wrap=True)
    first = report.rows[0]
    for row in report.rows:
        table.add_row(row.step, row.precision, _count(row.params), _count(row.macs),
                      format_bytes(row.ir_bytes), f"{first.ir_bytes / row.ir_bytes:.2f}x",
                      "-" if row.top1 is None else f"{row.top1 * 100:.2f}%",
                      *([("-" if row.metric is None else f"{row.metric:.4f}")] if metric else ()),
                      "-" if row.cosine is None else f"{row.cosine:.4f}", f"{row.p50_ms:.3f}",
                      f"{first.p50_ms / row.p50_ms:.2f}x")
    Console(highlight=False, width=max(out.width, 120)).print(table)  # ten columns: never squeeze into 80
    out.print(f"latency: {how['latency']}; threads={report.settings.threads}, inference precision "
              f"{report.settings.inference_precision}; host {how['host_cpu']}; quality: {how['quality']}"
              + (f"; {metric}: task metric {report.metric.name}" if metric else ""))


def _count(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.1f}K" if value >= 1e3 else str(value)


_VERDICT_STYLES = {"PASS": "[green]{}[/green]", "FAIL": "[bold red]{}[/bold red]", "EMULATED": "[yellow]{}[/yellow]",
                   "FAIL (emulated)": "[red]{}[/red]", "UNRELIABLE": "[yellow]{}[/yellow]"}


def print_validation(report) -> None:
    """The budget table (budget, measured, margin, PASS/FAIL) and how the figures were measured."""
    out = console()
    title = escape(f"{report.artifact} on {report.target or 'budgets'}")
    table = Table(title=title)
    for column in ("budget", "limit", "measured", "margin", "verdict"):
        table.add_column(column, justify="left" if column in ("budget", "verdict") else "right")
    for check in report.checks:
        measured = "not measured" if check.measured is None else _fmt(check.measured, check.unit)
        margin = "-" if check.margin is None else f"{_fmt(check.margin, check.unit)} ({check.margin_pct:+.0f}%)"
        verdict = _VERDICT_STYLES.get(check.verdict, "{}").format(check.verdict)  # EMULATED is never a PASS
        table.add_row(f"{check.name} ({check.description})", _fmt(check.budget, check.unit), measured, margin, verdict)
    out.print(table)
    lat = report.latency
    out.print(f"latency ms: p50 {lat.p50_ms:.4g} · p95 {lat.p95_ms:.4g} · p99 {lat.p99_ms:.4g} · max {lat.max_ms:.4g}"
              f" · mean {lat.mean_ms:.4g} ± {lat.stddev_ms:.3g} (CV {lat.cv:.3f}, p99/p50 {lat.p99_over_p50:.2f})"
              f" · {lat.throughput_fps:.0f} inferences/s")
    if report.runtime_latency:
        out.print(f"OpenVINO's own per-request time (InferRequest.latency, without the Python call): "
                  f"p50 {report.runtime_latency.p50_ms:.4g} · p99 {report.runtime_latency.p99_ms:.4g} ms")
    out.print(f"cold: load+compile {report.load_compile_ms:.1f} ms, first inference {report.first_inference_ms:.3f} ms")
    rss = report.peak_rss_bytes
    before = report.rss_before_load_bytes
    out.print(f"memory: artifact {format_bytes(report.artifact_bytes)} on disk; measuring process RSS "
              f"{format_bytes(before) if before else '?'} before load, peak {format_bytes(rss) if rss else '?'}")
    out.print(f"measured with: {report.measured_with(where=False)}")
    out.print(f"[bold yellow]{escape(report.emulation_note)}[/bold yellow]" if report.emulation_note
              else escape(f"measured on the device itself ({report.host['cpu_model']})"))
    for note in report.notes:
        out.print(escape(f"note: {note}"))
    if report.compress_gate is not None:
        out.print(f"[bold red]quality: {escape(report.compress_gate)}[/bold red]")
    if report.golden is not None:
        print_golden(report.golden)


def print_golden(result: dict) -> None:
    """An artifact against a golden set: per output, the metric, and the worst samples when it regressed."""
    from edgeopt.device.golden import golden_message

    out = console()
    verdict = "[green]PASS[/green]" if result["passed"] else "[bold red]FAIL[/bold red]"
    outputs = ", ".join(f"{o['name']} cosine {o['cosine']:.5f} (min {o['tolerance']['min_cosine']})"
                        for o in result["outputs"])
    out.print(f"golden set {escape(str(result['golden']))} ({result['samples']} samples): {verdict} · "
              f"{escape(outputs)}")
    metric = result.get("metric")
    if metric is not None:
        out.print(f"  metric {metric['primary']}: {metric['value']:.6g} vs {metric['reference']:.6g}, drop "
                  f"{metric['drop']:.4g} (max {metric['threshold']:.4g}; {metric['direction']} is better)")
    if not result["passed"]:
        out.print(escape(f"  {golden_message(result)}"))
    for note in result["notes"]:
        out.print(escape(f"  note: {note}"))


def _fmt(value: float, unit: str) -> str:
    return f"{value:.4g}{' ' + unit if unit else ''}"


def print_optimize_result(report: dict, out: Path) -> None:
    """The report's console sections (candidates ★ chosen / ◆ closest, the verdict, how it was measured), in the
    order of ``tables.sections``, and what was written."""
    from edgeopt.reporting import tables

    printer = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    for section in (s for s in tables.sections(report) if s.console):
        if section.kind == "table":
            headers, rows, _ = section.body
            table = Table(title=f"candidates for {report['target']['name']} (★ chosen, ◆ closest)")
            for header in headers:
                table.add_column(header, overflow="fold")
            for row in rows:
                table.add_row(*tables.marked(row), style=_STYLE[row.status])
            printer.print(table)
        elif section.kind == "verdict":
            printer.print(escape(section.body), style="bold green" if report["verdict"] == "found" else "bold red")
        elif section.kind == "fields" and section.key != "measured":
            for key, value in section.body:
                printer.print(escape(f"{key}: {value}"))
        elif section.kind == "fields":
            measured = [value for key, value in section.body if key.startswith("measured with")]
            printer.print(f"measured with: {measured[0]}" if measured else "nothing was measured")
    files = ", ".join(report.get("chosen_files", ["no artifact (none passed)"]))
    printer.print(escape(f"written to {out}: {files}, report.md, report.html, report.json"))


class SearchProgress:
    """One line per candidate on stderr (rich), updated as it is built, reused and measured."""

    def __init__(self, quiet: bool):
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._quiet = quiet
        self._tasks: dict[str, int] = {}
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=Console(file=sys.stderr, highlight=False,
                                                  width=None if sys.stderr.isatty() else 200), redirect_stdout=False,
                                  redirect_stderr=False, disable=quiet or not sys.stderr.isatty())

    def __enter__(self) -> "SearchProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def event(self, candidate, event: str) -> None:
        label = f"[{candidate.stage}] {candidate.label}"
        if candidate.label not in self._tasks:
            self._tasks[candidate.label] = self._progress.add_task(label, total=1)
        task = self._tasks[candidate.label]
        if event == "skipped":
            self._progress.update(task, description=f"{label}: skipped ({candidate.skipped})", completed=1)
        elif event == "done":
            self._progress.update(task, description=f"{label}: {_summary(candidate)}", completed=1)
        else:
            self._progress.update(task, description=f"{label}: {event}…")


def _summary(candidate) -> str:
    if candidate.skipped:
        return candidate.skipped
    cache = ("reused from cache" if all(candidate.reused.values())
             else "artifact reused, measured" if candidate.reused["artifact"] else "built and measured")
    verdict = "PASS" if candidate.passed else "FAIL: " + ", ".join(
        ([] if candidate.gate_passed else ["quality gate"]) + [c.name for c in candidate.failing]
        + ([] if candidate.eligible else [f"device lacks {candidate.precision}"]))
    return (f"{cache}; {candidate.file_bytes / 1e6:.3g} MB, p50 {candidate.figures['p50_ms']:.3g} ms, "
            f"{candidate.gate_check}; {verdict}")


class FleetProgress:
    """``edgeopt fleet`` on stderr: on a terminal, one live line per pair (what its current candidate is doing)
    under an overall line with the ETA; otherwise (a CI log) one plain, time-stamped line per event."""

    def __init__(self, quiet: bool, stream=None):
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._stream = stream or sys.stderr
        self._quiet, self._live = quiet, not quiet and self._stream.isatty()
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=Console(file=self._stream, highlight=False), disable=not self._live)
        self._tasks: dict[str, int] = {}
        self._started, self._total, self._done = time.monotonic(), 0, 0

    def __enter__(self) -> "FleetProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def start(self, pairs: list[str]) -> None:
        self._started, self._total = time.monotonic(), len(pairs)
        self._overall = self._progress.add_task(self._overall_text(), total=len(pairs))
        for pair in pairs:
            self._tasks[pair] = self._progress.add_task(f"{pair}: waiting", total=1)
        self._say(f"fleet: {len(pairs)} pairs")

    def candidate(self, pair: str) -> Callable:
        def event(candidate, what: str) -> None:
            text = f"{candidate.label}: " + (_summary(candidate) if what == "done" else
                                             f"skipped ({candidate.skipped})" if what == "skipped" else what)
            self._progress.update(self._tasks[pair], description=f"{pair}: {text}")
            self._say(f"{pair}: {text}")
        return event

    def pair_done(self, result) -> None:
        self._done += 1
        verdict = "PASS" if result.verdict == "found" else f"FAIL ({result.verdict})"
        self._progress.update(self._tasks[result.name], description=f"{result.name}: {verdict}: {result.why}",
                              completed=1)
        self._progress.update(self._overall, description=self._overall_text(), completed=self._done)
        self._say(f"pair {self._done}/{self._total} done: {verdict} {result.name}: {result.why}; {self._eta()}")

    def _overall_text(self) -> str:
        return f"fleet: {self._done}/{self._total} pairs done, {self._eta()}"

    def _eta(self) -> str:
        if not self._done:
            return "ETA unknown until a pair is done"
        if self._done == self._total:
            return "all done"
        left = (time.monotonic() - self._started) / self._done * (self._total - self._done)
        return f"ETA {int(left // 60)}m{int(left % 60):02d}s"

    def _say(self, line: str) -> None:
        if not self._quiet and not self._live:
            elapsed = time.monotonic() - self._started
            print(f"[{int(elapsed // 60):02d}:{elapsed % 60:04.1f}] {line}", file=self._stream, flush=True)


def print_fleet_summary(report: dict) -> None:
    """The matrix's final summary on stdout: one line per pair, then the totals (plain text, CI-readable)."""
    from edgeopt.reporting.fleet import summary_lines

    for line in summary_lines(report):
        print(line)


def print_targets(found: list, host) -> None:
    """``edgeopt targets list``: one row per profile, and whether this host is the device."""
    table = Table(title=f"device profiles (this host: {host.cpu_model}, {host.usable_cpus} CPUs)")
    for column in ("name", "device", "runtime", "p50/p99 ms", "this host"):
        table.add_column(column, no_wrap=column != "device")
    for t in found:
        b, s = t.budgets, t.settings
        table.add_row(t.name, t.device.name, f"{s.runtime} {s.threads}T {s.inference_precision}",
                      f"{b.p50_ms:g}/{b.p99_ms:g}", "yes" if t.is_host(host) else "emulated")
    console().print(table)


def print_target(target, emulation) -> None:
    """``edgeopt targets show``: the resolved profile, its budgets, and how this host would measure it."""
    from edgeopt.device.budgets import BUDGET_FIELDS

    out = console()
    chain = f" (extends {' → '.join(target.extends)})" if target.extends else ""
    out.print(f"[bold]{target.name}[/bold]: {target.description}\nsource: {target.source}{chain}")
    d = target.device
    out.print(f"device: {d.name}; {d.cpu}; {d.arch}, {d.cores} cores, {d.memory_mb} MB; ISA {', '.join(d.isa) or '-'}")
    s = target.settings
    if s.runtime == "onnxruntime":  # no streams, hint nor precision hint: the model runs in its file's precision
        spin = "" if s.spinning is None else f", spinning {'on' if s.spinning else 'off'}"
        out.print(f"runtime: onnxruntime (CPU), threads {s.threads}{spin}; precision: the model file's own")
    else:
        out.print(f"runtime: {s.runtime}, threads {s.threads}, streams {s.streams}, hint {s.performance_hint}, "
                  f"inference precision {s.inference_precision}")
    out.print(f"model precisions (preferred first): {', '.join(target.precisions)}")
    if target.input_shapes:
        out.print("input shapes: " + ", ".join(f"{k}={list(v)}" for k, v in target.input_shapes.items()))
    table = Table(title="budgets")
    for column in ("budget", "limit", "limits"):
        table.add_column(column)
    for key, value in target.budgets.items():
        _, unit, description = BUDGET_FIELDS[key]
        table.add_row(key, f"{value:g} {unit}".strip(), description)
    out.print(table)
    out.print(emulation.note if emulation else "this host is the device: measured natively")

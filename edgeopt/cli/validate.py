"""``edgeopt validate``: measure an artifact with a device profile's settings and check it against its budgets."""

from __future__ import annotations

import click

from edgeopt.cli.out_options import guard_outputs
from edgeopt.errors import BudgetError


@click.command()
@click.argument("artifact")
@click.option("--target", required=True, help="Device profile: a name from `edgeopt targets list` or a .toml path.")
@click.option("--runs", default=300, show_default=True, type=click.IntRange(min=1),
              help="Timed inferences (at least; see --min-seconds).")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(min=1),
              help="Untimed inferences first (the first one is reported as the cold latency).")
@click.option("--min-seconds", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Keep timing until this many seconds have passed, for a stable p99.")
@click.option("--input-shape", "input_shapes", multiple=True, help="NAME=D1,D2,... for dynamic inputs.")
@click.option("--json", "json_out", default=None, help="Write the report as JSON to this file ('-' for stdout).")
@click.option("--junit", "junit_out", default=None, help="Write a JUnit XML report (one test case per budget).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
def validate(artifact, target, runs, warmup, min_seconds, input_shapes, json_out, junit_out, quiet):
    """Validate ARTIFACT (.xml, .onnx, or a folder written by `edgeopt compress`) against a device profile.

    Exit 0 when every budget holds, 4 when one fails, 2 on bad input.
    """
    from edgeopt.device.reports import write_json, write_junit
    from edgeopt.source import parse_input_shapes
    from edgeopt.targets import load_target, model_in, validate_on

    guard_outputs(None, False, json_out=json_out, junit_out=junit_out)
    profile = load_target(target)
    shapes = parse_input_shapes(input_shapes)
    report = validate_on(profile, model_in(artifact, profile.settings.runtime), runs=runs, warmup=warmup,
                         min_seconds=min_seconds, input_shapes=shapes)
    if json_out:
        write_json(report, json_out)
    if junit_out:
        write_junit(report, junit_out)
    if not quiet and json_out != "-":
        print_validation(report)
    raise_if_failed([report])


def raise_if_failed(reports) -> None:
    failed = [f"{r.artifact}: {c.name}" for r in reports for c in r.checks if not c.passed]
    if failed:
        raise BudgetError(f"device budget failed ({'; '.join(failed)})")


def print_validation(report) -> None:
    """The budget table (budget, measured, margin, PASS/FAIL) and how the figures were measured."""
    from rich.table import Table

    from edgeopt.report_console import console, format_bytes

    out = console()
    title = f"{report.artifact} on {report.target or 'budgets'}"
    table = Table(title=title)
    for column in ("budget", "limit", "measured", "margin", "verdict"):
        table.add_column(column, justify="left" if column in ("budget", "verdict") else "right")
    for check in report.checks:
        measured = "not measured" if check.measured is None else _fmt(check.measured, check.unit)
        margin = "-" if check.margin is None else f"{_fmt(check.margin, check.unit)} ({check.margin_pct:+.0f}%)"
        verdict = "[green]PASS[/green]" if check.passed else "[bold red]FAIL[/bold red]"
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
    out.print(f"[bold yellow]{report.emulation_note}[/bold yellow]" if report.emulation_note
              else f"measured on the device itself ({report.host['cpu_model']})")
    for note in report.notes:
        out.print(f"note: {note}")


def _fmt(value: float, unit: str) -> str:
    return f"{value:.4g}{' ' + unit if unit else ''}"

"""``edgeopt optimize``: search the recipe space for a device profile and keep the best artifact that passes."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click

from edgeopt import jsonio
from edgeopt.cli.gate_options import gate_options, quality_gate
from edgeopt.cli.out_options import force_option, guard_outputs
from edgeopt.errors import BudgetError, QualityGateError
from edgeopt.out_guard import input_bytes
from edgeopt.targets import OBJECTIVES

_STYLE = {"chosen": "bold green", "closest": "bold yellow", "pass": "green", "fail": "red", "skipped": "dim"}


@click.command()
@click.argument("model")
@click.option("--target", required=True, help="Device profile: a name from `edgeopt targets list` or a .toml path.")
@click.option("--calib", "calibration", required=True, help="Calibration data: .npz, .npy, image folder or file.py:fn.")
@click.option("--eval", "eval_data", required=True, help="Evaluation data for the quality gate (labels: top-1).")
@click.option("--out", required=True, type=click.Path(), help="Output folder: the chosen artifact and the reports "
              "(written atomically).")
@gate_options
@click.option("--objective", type=click.Choice(OBJECTIVES), default=None,
              help="Among candidates that pass, pick the lowest of this figure (near-ties: the smaller file). "
                   "Default: the profile's model.objective, else p50_ms.")
@click.option("--plan", default=None, help="Search plan .toml (default: edgeopt/optimize/plan.toml).")
@click.option("--cache", "cache_dir", default=None, type=click.Path(),
              help="Cache of built candidates and measurements (default: $EDGEOPT_CACHE or ~/.cache/edgeopt).")
@click.option("--runs", default=300, show_default=True, type=click.IntRange(min=1),
              help="Timed inferences per candidate (at least).")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(min=1), help="Untimed inferences first.")
@click.option("--min-seconds", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Keep timing each candidate at least this long.")
@click.option("--input-shape", "input_shapes", multiple=True, help="NAME=D1,D2,... for dynamic inputs.")
@click.option("--device", "device_specs", multiple=True,
              help="Measure every candidate on this device over SSH (devices.toml name or ssh://user@host:port); "
                   "repeat for a pool of devices of the profile, measuring in parallel.")
@click.option("--require-device", is_flag=True,
              help="Exit 5 unless the choice rests on device figures (no emulated verdicts).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "json_out", default=None, help="Write the report as JSON to this file ('-' for stdout).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@force_option
def optimize(model, target, calibration, eval_data, out, max_drop, min_cosine, min_token_agreement,
             max_perplexity_ratio, objective, plan, cache_dir, runs, warmup, min_seconds, input_shapes, device_specs,
             require_device, seed, json_out, quiet, force, gate_outputs):
    """Find the best artifact of MODEL for a device: measure the baseline, then try the plan's stages in order
    (FP16/INT8, accuracy-controlled INT8, weight compression, pruning + distillation) until one meets every
    budget of the profile and the quality gate.

    Exit 0 when one is found, 3 when nothing keeps quality, 4 when nothing meets the budgets, 2 on bad input,
    5 when the devices give no figures (or --require-device and only emulated ones).
    """
    from edgeopt import atomic
    from edgeopt.cli.streams import library_output, warn
    from edgeopt.optimize.cache import Cache, default_cache_dir
    from edgeopt.optimize.search import Measuring, search
    from edgeopt.reporting import tables, write_reports
    from edgeopt.source import parse_input_shapes
    from edgeopt.device.host import host_info
    from edgeopt.targets import load_target

    guard_outputs(out, force, needs_bytes=3 * input_bytes(model), json_out=json_out)
    profile = load_target(target)
    gate = quality_gate(max_drop, min_cosine, min_token_agreement, max_perplexity_ratio, gate_outputs)
    cache = Cache(cache_dir or default_cache_dir(), warn=warn)
    pool = None
    if device_specs:
        from edgeopt.remote.pool import DevicePool

        pool = DevicePool(list(device_specs), profile, cache)
    elif require_device and not profile.is_host(host_info()):
        from edgeopt.errors import DeviceError

        raise DeviceError(f"--require-device: this host is not a {profile.name} and no --device was given, so every "
                          f"timing figure would be emulated")
    with _Progress(quiet) as progress, library_output(True):
        result = search(model, calibration, eval_data, profile, gate=gate, cache=cache, plan=plan,
                        measuring=Measuring(runs, warmup, min_seconds), objective=objective or profile.objective,
                        input_shapes=parse_input_shapes(input_shapes), seed=seed, pool=pool, progress=progress.event)
    report = result.describe() | ({"devices": pool.describe()} if pool else {})
    with atomic.atomic_dir(out) as tmp:
        if result.chosen:
            report["chosen_files"] = _copy_artifact(result.chosen.artifact, result.chosen.validation["files"], tmp)
        write_reports(report, tmp)
    if json_out == "-":
        click.echo(jsonio.dumps(report, indent=2))
    elif json_out:
        atomic.write_text(json_out, jsonio.dumps(report, indent=2))
    if not quiet and json_out != "-":
        _print(report, tables, Path(out))
    where = f"report: {Path(out) / 'report.md'}"
    unmeasured = [c.label for c in result.candidates if (c.skipped or "").startswith("unmeasured")]
    if unmeasured and not result.chosen:
        from edgeopt.errors import DeviceError

        raise DeviceError(f"no candidate chosen and {', '.join(unmeasured)} unmeasured: the device was lost; {where}")
    if result.verdict == "budgets":
        closest = result.closest
        raise BudgetError(f"no candidate meets every budget of {profile.name}; closest: {closest.label} "
                          f"({closest.recipe}) fails {tables.failing_text(closest.describe())}; {where}")
    if result.verdict == "quality":
        failed = "; ".join(f"{c.label}: {c.gate_check}" for c in result.candidates if c.gate_passed is False)
        raise QualityGateError(f"no candidate passes the quality gate ({failed or 'none was built'}); {where}")


def _copy_artifact(model_file: Path, files: dict, folder: Path) -> list[str]:
    for name in files:
        shutil.copy2(model_file.parent / name, folder / name)
    return list(files)


def _print(report: dict, tables, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    table = Table(title=f"candidates for {report['target']['name']} (★ chosen, ◆ closest)")
    for header in tables.CANDIDATE_HEADERS:
        table.add_column(header, overflow="fold")
    for row in tables.candidate_rows(report):
        mark = {"chosen": "★ ", "closest": "◆ "}.get(row.status, "")
        table.add_row(row.cells[0], mark + row.cells[1], *row.cells[2:], style=_STYLE[row.status])
    console.print(table)
    console.print(tables.verdict(report), style="bold green" if report["verdict"] == "found" else "bold red")
    measured = [value for key, value in tables.settings_lines(report) if key.startswith("measured with")]
    console.print(f"measured with: {measured[0]}" if measured else "nothing was measured")
    files = ", ".join(report.get("chosen_files", ["no artifact (none passed)"]))
    console.print(f"written to {out}: {files}, report.md, report.html, report.json")


class _Progress:
    """One line per candidate on stderr (rich), updated as it is built, reused and measured."""

    def __init__(self, quiet: bool):
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._quiet = quiet
        self._tasks: dict[str, int] = {}
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=Console(file=sys.stderr, highlight=False,
                                                  width=None if sys.stderr.isatty() else 200), redirect_stdout=False,
                                  redirect_stderr=False, disable=quiet or not sys.stderr.isatty())

    def __enter__(self) -> "_Progress":
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
    emulated = any(c.status != "measured" for c in candidate.checks)
    verdict = ("EMULATED" if emulated else "PASS") if candidate.passed else "FAIL: " + ", ".join(
        ([] if candidate.gate_passed else ["quality gate"]) + [c.name for c in candidate.failing]
        + ([] if candidate.eligible else [f"device lacks {candidate.precision}"]))
    return (f"{cache}; {candidate.file_bytes / 1e6:.3g} MB, p50 {candidate.figures['p50_ms']:.3g} ms, "
            f"{candidate.gate_check}; {verdict}")

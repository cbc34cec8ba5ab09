"""``edgeopt fleet``: every model of a fleet file for every target, on this host or a Ray cluster."""

from __future__ import annotations

from pathlib import Path

import click

from edgeopt.cli.out_options import force_option, guard_outputs
from edgeopt.errors import BadInputError, BudgetError, DeviceError, EdgeoptError, QualityGateError

_ERRORS = {2: BadInputError, 3: QualityGateError, 4: BudgetError, 5: DeviceError}


@click.command()
@click.argument("fleet_file", type=click.Path())
@click.option("--out", required=True, type=click.Path(),
              help="Output folder: MODEL/TARGET/ per pair (artifact, reports, bundle.tar.gz), the matrix "
                   "report.json/.md/.html and junit.xml (written atomically).")
@click.option("--executor", "executor_spec", default="local", show_default=True,
              help="local (this process, pair after pair), ray (a Ray cluster on this machine) or ray=ADDRESS "
                   "(an existing cluster: auto, HOST:PORT or ray://HOST:PORT).")
@click.option("--cache", "cache_dir", default=None, type=click.Path(),
              help="Cache of built candidates and measurements, shared by pairs and workers (default: "
                   "$EDGEOPT_CACHE or ~/.cache/edgeopt). Ray workers must see it at the same path.")
@click.option("--json", "json_out", default=None, help="Also write the matrix report as JSON here ('-': stdout).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@force_option
def fleet(fleet_file, out, executor_spec, cache_dir, json_out, quiet, force):
    """Optimize every model of FLEET_FILE (fleet.toml) for every target: per pair the chosen artifact, its
    bundle and reports, and one matrix report of which pairs pass and why not.

    Exit code: the worst pair's (1 a bug, 2 bad input, 5 no device figures, 3 quality, 4 budgets, 0 all pass).
    """
    from edgeopt.cli.streams import library_output, warn
    from edgeopt.fleet.executors import make_executor
    from edgeopt.fleet.run import run_fleet
    from edgeopt.fleet.spec import load_fleet
    from edgeopt.optimization.cache import default_cache_dir
    from edgeopt.reporting.console import FleetProgress, emit, print_fleet_summary

    guard_outputs(out, force, json_out=json_out)
    spec = load_fleet(fleet_file)
    with FleetProgress(quiet) as progress, library_output(True):
        executor = make_executor(executor_spec)
        try:
            report = run_fleet(spec, Path(out), executor=executor, cache_dir=Path(cache_dir or default_cache_dir()),
                               progress=progress, warn=warn)
        finally:
            executor.close()
    data = report.to_dict()
    emit(data, lambda: print_fleet_summary(data), json_out, quiet)
    if report.exit_code:
        failing = [p for p in report.pairs if p["exit_code"]]
        worst = next(p for p in failing if p["exit_code"] == report.exit_code)
        raise _ERRORS.get(report.exit_code, EdgeoptError)(
            f"{len(failing)} of {len(report.pairs)} pairs fail; worst: {worst['model']} × {worst['target']}: "
            f"{worst['why']}; report: {Path(out) / 'report.md'}")

"""``edgeopt validate``: measure an artifact with a device profile's settings and check it against its budgets."""

from __future__ import annotations

import click

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
    from edgeopt.api import validate as run_validate
    from edgeopt.device.reports import write_json, write_junit
    from edgeopt.reporting.console import print_validation
    from edgeopt.source import parse_input_shapes
    from edgeopt.targets import Measuring

    report = run_validate(artifact, target, measuring=Measuring(runs, warmup, min_seconds),
                          input_shapes=parse_input_shapes(input_shapes))
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

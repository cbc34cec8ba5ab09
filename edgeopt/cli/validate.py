"""``edgeopt validate``: measure an artifact with a device profile's settings and check it against its budgets."""

from __future__ import annotations

import click

from edgeopt.cli.out_options import guard_outputs
from edgeopt.errors import BudgetError


@click.command()
@click.argument("artifact")
@click.option("--target", default=None,
              help="Device profile: a name from `edgeopt targets list` or a .toml path (with --device: the "
                   "device's own profile by default; with --import: the bundle's).")
@click.option("--device", "device_spec", default=None,
              help="Measure on this device over SSH: a name from devices.toml (`edgeopt devices list`) or "
                   "ssh://user@host:port (with --target).")
@click.option("--import", "import_path", default=None, type=click.Path(dir_okay=False),
              help="Judge the results a device wrote (`python -m edgeopt.device validate BUNDLE --json FILE`); "
                   "ARTIFACT is that bundle, checked by its sha256.")
@click.option("--require-device", is_flag=True,
              help="Exit 5 unless every figure comes from the device itself (no emulated verdicts).")
@click.option("--runs", default=300, show_default=True, type=click.IntRange(min=1),
              help="Timed inferences (at least; see --min-seconds).")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(min=1),
              help="Untimed inferences first (the first one is reported as the cold latency).")
@click.option("--min-seconds", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Keep timing until this many seconds have passed, for a stable p99.")
@click.option("--golden", default=None, type=click.Path(file_okay=False),
              help="Also check the artifact against this golden set (`edgeopt golden create`): per-output "
                   "tolerances and the metric threshold; exit 3 on a regression, naming the worst samples. (A "
                   "bundle's own golden set is checked on the device.)")
@click.option("--metric", default=None, metavar="FILE.py:FUNCTION",
              help="With --golden: evaluate this metric file instead of the one the golden set holds.")
@click.option("--input-shape", "input_shapes", multiple=True, help="NAME=D1,D2,... for dynamic inputs.")
@click.option("--json", "json_out", default=None, help="Write the report as JSON to this file ('-' for stdout).")
@click.option("--junit", "junit_out", default=None, help="Write a JUnit XML report (one test case per budget).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
def validate(artifact, target, device_spec, import_path, require_device, runs, warmup, min_seconds, input_shapes,
             json_out, junit_out, quiet, golden, metric):
    """Validate ARTIFACT (.xml, .onnx, a folder written by `edgeopt compress`, or with --device / --import a
    bundle from `edgeopt package`) against a device profile:
    here (emulating the device when this host is not it), on the device over SSH (--device), or from the
    results a device wrote (--import).

    Exit 0 when every budget holds, 3 when the artifact regresses against a golden set (--golden, or the one a
    bundle carries) or failed the quality gate of the `edgeopt compress` that wrote it (its report.json), 4 when
    a budget fails, 2 on bad input, 5 when no device figures could be had (device
    unreachable, lost or unusable; or --require-device and only emulated figures).
    """
    from dataclasses import replace
    from pathlib import Path

    from edgeopt.api import validate as run_validate
    from edgeopt.device.reports import write_json, write_junit
    from edgeopt.errors import BadInputError
    from edgeopt.packaging import gate_failure
    from edgeopt.reporting.console import print_validation
    from edgeopt.source import parse_input_shapes
    from edgeopt.targets import Measuring, load_target, model_in


    guard_outputs(None, False, json_out=json_out, junit_out=junit_out)
    if device_spec and import_path:
        raise BadInputError("--device and --import exclude each other (measure now, or judge earlier results)")
    shapes = parse_input_shapes(input_shapes)
    if golden and (device_spec or import_path):
        raise BadInputError("--golden checks an artifact here; with --device or --import the bundle's own golden "
                            "set (edgeopt package --golden) is checked on the device")
    if metric and not golden:
        raise BadInputError("--metric needs --golden (the reference outputs and targets it is evaluated on)")
    spec = None
    if metric:
        from edgeopt.user_metric import load_metric

        spec = load_metric(metric)
    if import_path:
        report = _imported(artifact, import_path, target)
    elif device_spec:
        from edgeopt.remote.devices import load_device
        from edgeopt.remote.run import measure

        device = load_device(device_spec, target)
        if device.profile is None:
            raise BadInputError(f"{device_spec}: an ssh:// device needs --target (the profile it is an instance of)")
        profile = load_target(target or device.profile)
        model = artifact if artifact.endswith(".tar.gz") else model_in(artifact, profile.settings.runtime)
        failure = None if artifact.endswith(".tar.gz") else gate_failure(Path(artifact), model)
        report = replace(measure(device, profile, model, runs=runs, warmup=warmup, min_seconds=min_seconds,
                                 input_shapes=shapes).report, compress_gate=failure)
    else:
        if target is None:
            raise BadInputError("validate needs --target (or --device, or --import)")
        profile = load_target(target)
        report = run_validate(artifact, profile, measuring=Measuring(runs, warmup, min_seconds), input_shapes=shapes,
                              golden=golden, metric=spec)
    if json_out:
        write_json(report, json_out)
    if junit_out:
        write_junit(report, junit_out)
    if not quiet and json_out != "-":
        print_validation(report)
    raise_if_regressed([report])
    if require_device:
        raise_if_not_device([report])
    raise_if_failed([report])


def _imported(bundle: str, results: str, target: str | None):
    """A device's results for ``bundle``, judged against ``target``'s budgets (default: the bundle's own)."""
    from edgeopt.device.budgets import Budgets
    from edgeopt.device.bundle_reader import open_bundle
    from edgeopt.device.host import not_the_device
    from edgeopt.remote.results import check_bundle, read_result, to_report
    from edgeopt.targets import load_target

    data = read_result(results)
    check_bundle(data, bundle, results)
    manifest = open_bundle(bundle).manifest
    budgets = load_target(target).budgets if target else Budgets.from_dict(manifest["target"]["budgets"])
    host = data["host"]
    other = not_the_device(manifest["target"]["device"], host["machine"], host["cpu_model"], host.get("usable_cpus"))
    note = (f"imported from {results}: measured {'on another machine' if other else 'on the device'} "
            f"({host['cpu_model']}, {host['machine']}, {host['os']}) on bundle sha256 {data['bundle']['sha256']}")
    if other and data["emulation_note"] is None:  # a result from a validator that did not check its host
        data = data | {"emulation_note": f"not the profiled device ({manifest['target']['device']['name']}): {other}"}
    return to_report(data, budgets, device_note=note)


def raise_if_not_device(reports) -> None:
    """--require-device: exit 5 when a verdict rests on figures from another machine than the device."""
    from edgeopt.errors import DeviceError

    emulated = [r for r in reports if r.emulation_note is not None]
    if emulated:
        names = sorted({c.name for r in emulated for c in r.checks if c.status != "measured"})
        raise DeviceError(f"--require-device: no device figures for {', '.join(r.artifact for r in emulated)}, only "
                          f"emulated ones ({', '.join(names)}); measure on the device (--device NAME, or --import "
                          f"its results)")


def raise_if_regressed(reports) -> None:
    """Exit 3 when an artifact regressed against its golden set, or failed the quality gate of the edgeopt
    compress run that wrote it."""
    from edgeopt.device.golden import golden_message
    from edgeopt.errors import QualityGateError

    failed = [golden_message(r.golden) for r in reports if r.golden is not None and not r.golden["passed"]]
    failed += [r.compress_gate for r in reports if r.compress_gate is not None]
    if failed:
        raise QualityGateError("quality regression: " + " | ".join(failed))


def raise_if_failed(reports) -> None:
    failed = [f"{r.artifact}: {c.name}" for r in reports for c in r.checks if not c.passed]
    if failed:
        raise BudgetError(f"device budget failed ({'; '.join(failed)})")

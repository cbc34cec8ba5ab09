"""``edgeopt package`` (write a device bundle) and ``edgeopt verify`` (check one)."""

from __future__ import annotations

import click


@click.command()
@click.argument("artifact")
@click.option("--target", required=True, help="Device profile: a name from `edgeopt targets list` or a .toml path.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Bundle to write (.tar.gz, atomically).")
@click.option("--format", "formats", default=None,
              help="Model formats to include, e.g. openvino,onnx (default: only the one the target runs).")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="Validation report of this artifact on this target (`edgeopt validate --json`) to bundle instead "
              "of measuring again; needed for byte-identical rebuilds.")
@click.option("--build-id", default=None, help="An identifier recorded in the manifest (the only variable field).")
@click.option("--preprocess", type=click.Path(dir_okay=False), default=None,
              help="preprocess.toml describing the input preprocessing, recorded in the manifest.")
@click.option("--input-shape", "input_shapes", multiple=True, help="NAME=D1,D2,... for dynamic inputs.")
@click.option("--runs", default=300, show_default=True, type=click.IntRange(min=1),
              help="Without --report: timed inferences for validation (at least).")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--min-seconds", default=2.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--json", "json_out", default=None, help="Write the result (with the manifest) as JSON ('-': stdout).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
def package(artifact, target, out, formats, report, build_id, preprocess, input_shapes, runs, warmup, min_seconds,
            json_out, quiet):
    """Validate ARTIFACT (.xml, .onnx or an `edgeopt compress` folder) on a target and write a device bundle.

    Exit 0 ok, 2 bad input, 3 the artifact failed its quality gate, 4 a device budget failed (nothing written).
    """
    from edgeopt.formats import parse_formats
    from edgeopt.targets import Measuring
    from edgeopt.packaging import package as run_package
    from edgeopt.reporting.console import emit
    from edgeopt.source import parse_input_shapes

    result = run_package(artifact, target, out, formats=parse_formats(formats) if formats else None, report=report,
                         build_id=build_id, preprocess=preprocess, input_shapes=parse_input_shapes(input_shapes),
                         measuring=Measuring(runs, warmup, min_seconds))
    emit(result.describe(), f"{result.path}: {result.bytes} bytes, sha256 {result.sha256}", json_out, quiet)


@click.command()
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--json", "json_out", default=None, help="Write the result (with the manifest) as JSON ('-': stdout).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
def verify(bundle, json_out, quiet):
    """Check BUNDLE: manifest schema, size and sha256 of every file, safe paths. Exit 0 ok, 2 otherwise."""
    from edgeopt.device.bundle_reader import describe, open_bundle, summary
    from edgeopt.reporting.console import emit

    checked = open_bundle(bundle)
    emit(describe(checked), summary(checked), json_out, quiet)

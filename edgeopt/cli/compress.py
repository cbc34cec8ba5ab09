"""``edgeopt compress``: load → compress → convert → (validate) and write artifacts atomically."""

from __future__ import annotations

import click

from edgeopt.cli.gate_options import gate_options, quality_gate
from edgeopt.cli.validate import raise_if_failed
from edgeopt.cli.weight_options import weight_options, weights_step
from edgeopt.errors import BadInputError, QualityGateError


@click.command()
@click.argument("model")
@click.option("--calib", "calibration", required=True, help="Calibration data: .npz, .npy, image folder or file.py:fn.")
@click.option("--out", required=True, type=click.Path(), help="Output folder (written atomically).")
@click.option("--format", "formats", default=None, help="Comma-separated: openvino,onnx (default: both, "
              "openvino only for an OpenVINO IR input).")
@click.option("--precision", type=click.Choice(["int8", "fp16", "fp32"]), default=None,
              help="Output precision (shorthand for a one-step recipe; default int8).")
@click.option("--recipe", default=None, help="Steps, e.g. prune,distill,int8, or a recipe .toml file.")
@click.option("--eval", "eval_data", default=None, help="Evaluation data (with labels for top-1).")
@click.option("--train", "train_data", default=None, help="Training data for prune/distill/qat fine-tuning "
              "(same forms as --calib; default: the calibration set).")
@click.option("--step-report/--no-step-report", default=None, help="Measure params, MACs, size, accuracy and "
              "latency after every recipe step (default: on when the recipe has a PyTorch step).")
@gate_options
@click.option("--input-shape", "input_shapes", multiple=True, help="NAME=D1,D2,... for dynamic inputs.")
@click.option("--target", default=None, help="Device profile (name or .toml): use its preferred precision (unless "
              "--precision or the recipe sets one) and input shapes, then validate the artifact it runs against its budgets (exit 4 when one fails).")
@click.option("--validate-runs", default=300, show_default=True, type=click.IntRange(min=1),
              help="With --target: timed inferences for validation (at least).")
@click.option("--validate-seconds", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="With --target: keep timing at least this long.")
@click.option("--package", "package_out", default=None, type=click.Path(dir_okay=False),
              help="With --target: also write a device bundle (.tar.gz) of the validated artifact.")
@click.option("--build-id", default=None, help="With --package: an identifier recorded in the bundle's manifest.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "json_out", default=None, help="Write the report as JSON to this file ('-' for stdout).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@weight_options
def compress(model, calibration, out, formats, precision, recipe, eval_data, max_drop, min_cosine, input_shapes,
             seed, json_out, quiet, target, validate_runs, validate_seconds, package_out, build_id, train_data,
             step_report,
             min_token_agreement, max_perplexity_ratio, **weight_args):
    """Compress MODEL (ONNX, OpenVINO IR, file.py:factory, TorchScript or .pt2) and write IR/ONNX to OUT."""
    from edgeopt.api import compress as run_compress
    from edgeopt.cli.streams import library_output
    from edgeopt.reporting.console import emit, print_compress_result
    from edgeopt.source import parse_input_shapes
    from edgeopt.targets import Measuring

    if package_out and not target:
        raise BadInputError("--package needs --target (the bundle carries the target's settings and budgets)")
    with library_output(quiet):
        result = run_compress(model, calibration, out=out, recipe=recipe, precision=precision, target=target,
                              formats=formats, weights=weights_step(weight_args), eval_data=eval_data,
                              gate=quality_gate(max_drop, min_cosine, min_token_agreement, max_perplexity_ratio),
                              input_shapes=parse_input_shapes(input_shapes), seed=seed, train_data=train_data,
                              step_report=step_report, quiet=quiet,
                              measuring=Measuring(validate_runs, min_seconds=validate_seconds))
    emit(result.describe(), lambda: print_compress_result(result), json_out, quiet)
    if not result.quality_passed:
        failed = [f"{name}: {msg}" for name, (ok, msg) in result.gate_results.items() if not ok]
        raise QualityGateError("quality gate failed: " + "; ".join(failed))
    raise_if_failed(result.validations)
    if package_out:
        from edgeopt.packaging import package

        bundle = package(result.out, result.target, package_out, report=result.validations[0].to_dict(),
                         build_id=build_id)
        if not quiet and json_out != "-":
            click.echo(f"{bundle.path}: {bundle.bytes} bytes, sha256 {bundle.sha256}")

"""``edgeopt compress``: load → compress → convert → (validate) and write artifacts atomically."""

from __future__ import annotations

import click

from edgeopt import jsonio
from edgeopt.cli.gate_options import gate_options, quality_gate
from edgeopt.cli.out_options import force_option, guard_outputs
from edgeopt.cli.validate import raise_if_failed
from edgeopt.cli.weight_options import weight_options, weights_step
from edgeopt.errors import BadInputError, QualityGateError
from edgeopt.out_guard import input_bytes


@click.command()
@click.argument("model")
@click.option("--calib", "calibration", required=True, help="Calibration data: .npz, .npy, image folder or file.py:fn.")
@click.option("--out", required=True, type=click.Path(), help="Output folder (written atomically).")
@click.option("--format", "formats", default=None, help="Comma-separated: openvino,onnx (default: both, "
              "openvino only for an OpenVINO IR input; with --target, the format it runs).")
@click.option("--precision", type=click.Choice(["int8", "fp16", "fp32"]), default=None,
              help="Output precision (shorthand for a one-step recipe; default int8).")
@click.option("--recipe", default=None, help="Steps, e.g. prune,distill,int8, or a recipe .toml file.")
@click.option("--eval", "eval_data", default=None, help="Evaluation data (with labels for top-1).")
@click.option("--repair", is_flag=True, help="When INT8 misses the quality gate, repair it (int8_repair: model type, "
              "SmoothQuant, bias correction, preset, then the most sensitive operations in float); needs --eval.")
@click.option("--train", "train_data", default=None, help="Training data for prune/distill/qat fine-tuning "
              "(same forms as --calib; default: the calibration set).")
@click.option("--step-report/--no-step-report", default=None, help="Measure params, MACs, size, accuracy and "
              "latency after every recipe step (default: on when the recipe has a PyTorch step).")
@gate_options
@click.option("--golden", default=None, type=click.Path(file_okay=False),
              help="A golden set (`edgeopt golden create`): also check every artifact against its per-output "
                   "tolerances and metric threshold (exit 3 on a regression, naming the worst samples); with "
                   "--package it goes into the bundle.")
@click.option("--input-shape", "input_shapes", multiple=True, help="NAME=D1,D2,... for dynamic inputs.")
@click.option("--batch-axis", "batch_axes", multiple=True, help="NAME=AXIS: the axis of an input that holds the "
              "batch (e.g. state=1; NAME=none for none), where the model does not say it.")
@click.option("--task", default=None, help="For a Hugging Face model folder: the task whose head to load "
              "(feature-extraction, text-classification, token-classification, fill-mask, text-generation; "
              "default: from config.json's architecture).")
@click.option("--target", default=None, help="Device profile (name or .toml): use its preferred precision (unless "
              "--precision or the recipe sets one) and input shapes, then validate the artifact it runs against its budgets (exit 4 when one fails).")
@click.option("--validate-runs", default=300, show_default=True, type=click.IntRange(min=1),
              help="With --target: timed inferences for validation (at least).")
@click.option("--validate-seconds", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="With --target: keep timing at least this long.")
@click.option("--device", "device_spec", default=None,
              help="With --target: validate on this device over SSH (devices.toml name or ssh://user@host:port).")
@click.option("--require-device", is_flag=True,
              help="With --target: exit 5 unless the validation's figures come from the device itself.")
@click.option("--package", "package_out", default=None, type=click.Path(dir_okay=False),
              help="With --target: also write a device bundle (.tar.gz) of the validated artifact.")
@click.option("--build-id", default=None, help="With --package: an identifier recorded in the bundle's manifest.")
@click.option("--sign", default=None, metavar="KEY", help="With --package: sign the bundle with this Ed25519 "
              "private key (file, or env:NAME).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "json_out", default=None, help="Write the report as JSON to this file ('-' for stdout).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@force_option
@weight_options
def compress(model, calibration, out, formats, precision, recipe, eval_data, max_drop, min_cosine, input_shapes,
             seed, json_out, quiet, target, validate_runs, validate_seconds, device_spec, require_device, package_out,
             build_id, sign, train_data, step_report, force, min_token_agreement, max_perplexity_ratio, gate_outputs,
             batch_axes, task, metric, max_rel_drop, golden, repair, **weight_args):
    """Compress MODEL (ONNX, OpenVINO IR, file.py:factory, TorchScript, .pt2 or a Hugging Face model folder)
    and write IR/ONNX to OUT."""
    from edgeopt.api import compress as run_compress
    from edgeopt.batch_axes import parse_batch_axes
    from edgeopt.cli.streams import library_output
    from edgeopt.cli.validate import raise_if_not_device
    from edgeopt.reporting.console import emit, print_compress_result
    from edgeopt.source import parse_input_shapes
    from edgeopt.targets import Measuring

    if (device_spec or require_device) and not target:
        raise BadInputError("--device and --require-device need --target (the profile to validate against)")
    if package_out and not target:
        raise BadInputError("--package needs --target (the bundle carries the target's settings and budgets)")
    guard_outputs(out, force, needs_bytes=3 * input_bytes(model), json_out=json_out, bundle=package_out)
    if sign and not package_out:
        raise BadInputError("--sign needs --package (it signs the bundle)")
    if sign:
        from edgeopt.signing import Signer

        sign = Signer(sign)  # a bad key fails now, not after compressing
    measuring = Measuring(validate_runs, min_seconds=validate_seconds)
    with library_output(quiet):
        result = run_compress(model, calibration, out=out, recipe=recipe, precision=precision, target=target,
                              formats=formats, weights=weights_step(weight_args), eval_data=eval_data,
                              gate=quality_gate(max_drop, min_cosine, min_token_agreement, max_perplexity_ratio,
                                                gate_outputs, metric, max_rel_drop),
                              input_shapes=parse_input_shapes(input_shapes), seed=seed, train_data=train_data,
                              step_report=step_report, quiet=quiet,
                              measuring=None if device_spec else measuring,
                              batch_axes=parse_batch_axes(batch_axes), task=task, golden=golden,
                              repair=repair)
        if device_spec and result.target is not None and result.quality_passed:
            _validate_remote(result, device_spec, measuring)
    emit(result.describe(), lambda: print_compress_result(result), json_out, quiet)
    if not result.quality_passed:
        failing = {name: msg for name, (ok, msg) in result.gate_results.items() if not ok}
        int8_ir = "openvino" in failing and "int8" in result.recipe.names
        hint = ("; --repair tries cheaper fixes, then keeps the most sensitive operations float (OpenVINO IR)"
                if int8_ir and eval_data and not repair else "")
        normalising = (result.decisions.get("int8") or {}).get("normalisations")
        if normalising and "int8" in result.recipe.names:
            hint += (f"; a recipe's int8 step with model_type = \"transformer\" keeps the model's {normalising} "
                     f"normalisation(s) by a computed statistic float")
        if int8_ir:
            hint += ("; --weights int8_asym stores int8 weights and computes in float (about 4x smaller, usually "
                     "the smallest loss of the INT8 options)")
        rescue = (result.decisions.get("onnx_int8") or {}).get("rescue") if "onnx" in failing else None
        if rescue:
            hint += (f"; for the ONNX file, {rescue['backend']} (int8 weights, float compute) reached cosine "
                     f"{rescue['cosine']:.4f} at {rescue['p50_ratio']:.2f}x FP32's p50: a recipe's int8 step with "
                     f"onnx_backend = \"{rescue['backend']}\" pins it")
        raise QualityGateError("quality gate failed: " + "; ".join(f"{n}: {m}" for n, m in failing.items()) + hint)
    if require_device:
        raise_if_not_device(result.validations)
    raise_if_failed(result.validations)
    for fmt, cosine in result.in_sample_cosine.items():  # nothing gated them, and one reads broken
        if cosine < result.gate.min_cosine:
            click.echo(f"edgeopt: warning: the {fmt} artifact's worst output reads cosine {cosine:.4f} to the original "
                       f"on calibration samples, below {result.gate.min_cosine:g}, and nothing gated it (give "
                       f"--eval)", err=True)
    for fmt, flags in result.flagged.items():  # the exit summary, even with --quiet (a failed run's one line
        click.echo(f"edgeopt: warning: the {fmt} artifact is {' and '.join(flags)} "  # is its error; the flags
                   f"({result.vs_fp32[fmt].summary()})", err=True)  # are in report.json and the table)
    if package_out:
        from edgeopt.packaging import package

        bundle = package(result.out, result.target, package_out, report=result.validations[0].to_dict(),
                         build_id=build_id, sign=sign, golden=golden)
        if not quiet and json_out != "-":
            click.echo(f"{bundle.path}: {bundle.bytes} bytes, sha256 {bundle.sha256}")


def _validate_remote(result, device_spec: str, measuring) -> None:
    """Validate the artifact(s) the profile's runtime runs on ``device_spec`` over SSH; add the reports to the
    result and to report.json (atomically)."""
    from pathlib import Path

    from edgeopt import atomic
    from edgeopt.remote.devices import load_device
    from edgeopt.remote.run import measure

    profile = result.target
    device = load_device(device_spec, profile.name)
    result.validations = [measure(device, profile, artifact.path, runs=measuring.runs,
                                  min_seconds=measuring.min_seconds).report
                          for artifact in result.artifacts if artifact.runtime == profile.settings.runtime]
    atomic.write_text(Path(result.out) / "report.json", jsonio.dumps(result.describe(), indent=2))

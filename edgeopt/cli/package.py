"""``edgeopt package`` (write a device bundle) and ``edgeopt verify`` (check one)."""

from __future__ import annotations

import click

from edgeopt.cli.out_options import force_option, guard_outputs
from edgeopt.out_guard import input_bytes


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
@click.option("--golden", default=None, type=click.Path(file_okay=False),
              help="Check every bundled model against this golden set (`edgeopt golden create`; exit 3 on a "
                   "regression, nothing written), then ship it in the bundle: `python -m edgeopt.device validate` "
                   "checks quality on the device too (docs/golden.md).")
@click.option("--input-shape", "input_shapes", multiple=True, help="NAME=D1,D2,... for dynamic inputs.")
@click.option("--runs", default=300, show_default=True, type=click.IntRange(min=1),
              help="Without --report: timed inferences for validation (at least).")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--min-seconds", default=2.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--sign", "sign", default=None, metavar="KEY",
              help="Sign the manifest with this Ed25519 private key (a file from `edgeopt keys generate`, or "
              "env:NAME for a PEM in an environment variable).")
@click.option("--json", "json_out", default=None, help="Write the result (with the manifest) as JSON ('-': stdout).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@force_option
def package(artifact, target, out, formats, report, build_id, preprocess, input_shapes, runs, warmup, min_seconds,
            sign, json_out, quiet, force, golden):
    """Validate ARTIFACT (.xml, .onnx or an `edgeopt compress` folder) on a target and write a device bundle.

    Exit 0 ok, 2 bad input, 3 the artifact failed its quality gate or regressed against --golden, 4 a device budget
    failed (nothing written).
    """
    from edgeopt.formats import parse_formats
    from edgeopt.packaging import NotPackaged
    from edgeopt.packaging import package as run_package
    from edgeopt.reporting.console import emit, print_validation
    from edgeopt.source import parse_input_shapes
    from edgeopt.targets import Measuring

    guard_outputs(None, force, json_out=json_out, bundle=out, needs_bytes=2 * input_bytes(artifact))
    try:
        result = run_package(artifact, target, out, formats=parse_formats(formats) if formats else None,
                             report=report, build_id=build_id, preprocess=preprocess,
                             input_shapes=parse_input_shapes(input_shapes),
                             measuring=Measuring(runs, warmup, min_seconds), sign=sign, golden=golden)
    except NotPackaged as refused:  # the figures that failed, on the console and in --json, then exit 4
        measured = refused.report
        emit(refused.describe(), (lambda: print_validation(measured)) if measured else "", json_out,
             quiet or measured is None)
        raise
    emit(result.describe(), f"{result.path}: {result.bytes} bytes, sha256 {result.sha256}", json_out, quiet)


@click.command()
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--trust", multiple=True, type=click.Path(), metavar="PUBKEY",
              help="Accept only a bundle signed by one of these Ed25519 public keys (PEM files, or folders of "
              "*.pem/*.pub); repeatable.")
@click.option("--show", is_flag=True, help="Also print the provenance: source model, data, recipe, tools, profile.")
@click.option("--json", "json_out", default=None, help="Write the result (with the manifest) as JSON ('-': stdout).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--max-extract-mb", type=click.FloatRange(min=0), default=None,
              help="Largest total size of the bundle's files (default: 100x the bundle's size, at least 64 MiB, "
                   "at most 16 GiB).")
def verify(bundle, trust, show, json_out, quiet, max_extract_mb):
    """Check BUNDLE: manifest schema, size and sha256 of every file, safe paths, and with --trust its signature.

    Exit 0 ok, 2 otherwise (unsigned with --trust, unknown key, bad signature, changed after signing, corrupt).
    """
    from edgeopt.device.bundle_reader import describe, open_bundle, summary
    from edgeopt.device.signature import load_trust
    from edgeopt.provenance import show as show_provenance
    from edgeopt.reporting.console import emit

    guard_outputs(None, False, json_out=json_out)
    checked = open_bundle(bundle, max_bytes=None if max_extract_mb is None else int(max_extract_mb * 1e6),
                          trust=load_trust(trust) if trust else None)
    lines = [summary(checked), *(show_provenance(checked.manifest) if show else [])]
    emit(describe(checked), "\n".join(lines), json_out, quiet)


"""The on-device validator: ``python -m edgeopt.device validate BUNDLE`` (console script ``edgeopt-device``).

Checks the bundle, extracts it to a temporary folder, measures its model with the target's runtime settings
in a separate process (latency distribution, peak RSS), checks the bundled budgets and writes JSON / JUnit.
Needs numpy and the one runtime the manifest names; no torch, nncf, click or rich. Plain text, no prompts.

Exit codes: 0 ok, 1 internal error, 2 bad input (missing, tampered or truncated bundle, missing runtime),
4 a device budget failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from dataclasses import replace

from edgeopt.errors import BadInputError, BudgetError, EdgeoptError, first_line

PROG = "edgeopt-device"
RUNTIME_PACKAGES = {"openvino": "openvino", "onnxruntime": "onnxruntime"}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        args.run(args)
        return 0
    except EdgeoptError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: one line, not a traceback
        print(f"{PROG}: internal error: {type(exc).__name__}: {first_line(exc)}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Check a device bundle and validate it on this device.")
    commands = parser.add_subparsers(dest="command", required=True)
    validate = commands.add_parser("validate", help="check, measure and compare against the bundled budgets")
    validate.add_argument("bundle")
    validate.add_argument("--runs", type=_positive, default=300, help="timed inferences, at least (default 300)")
    validate.add_argument("--warmup", type=_positive, default=20, help="untimed inferences first (default 20)")
    validate.add_argument("--min-seconds", type=float, default=2.0,
                          help="keep timing until this many seconds have passed (default 2)")
    validate.add_argument("--json", dest="json_out", help="write the report as JSON to this file ('-': stdout)")
    validate.add_argument("--junit", dest="junit_out", help="write a JUnit XML report, one test case per budget")
    validate.add_argument("--quiet", action="store_true", help="print nothing but errors")
    validate.set_defaults(run=_validate)
    verify = commands.add_parser("verify", help="check checksums and manifest only")
    verify.add_argument("bundle")
    verify.add_argument("--json", dest="json_out", help="write the result as JSON to this file ('-': stdout)")
    verify.add_argument("--quiet", action="store_true", help="print nothing but errors")
    verify.set_defaults(run=_verify)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _verify(args) -> None:
    import json

    from edgeopt.atomic import write_text
    from edgeopt.device.bundle_reader import describe, open_bundle, summary

    bundle = open_bundle(args.bundle)
    if args.json_out == "-":
        print(json.dumps(describe(bundle), indent=2))
    elif args.json_out:
        write_text(args.json_out, json.dumps(describe(bundle), indent=2) + "\n")
    if not args.quiet and args.json_out != "-":
        print(summary(bundle))


def _validate(args) -> None:
    from edgeopt.device.bundle_reader import open_bundle
    from edgeopt.device.reports import write_json, write_junit

    with tempfile.TemporaryDirectory(prefix="edgeopt-bundle-") as tmp:
        bundle = open_bundle(args.bundle, extract_to=tmp)
        report = validate_bundle(bundle, args.runs, args.warmup, args.min_seconds)
    if args.json_out:
        write_json(report, args.json_out)
    if args.junit_out:
        write_junit(report, args.junit_out)
    if not args.quiet and args.json_out != "-":
        print(_text(bundle, report))
    failed = [c.name for c in report.checks if not c.passed]
    if failed:
        raise BudgetError(f"device budget failed: {', '.join(failed)} (target {report.target})")


def validate_bundle(bundle, runs: int, warmup: int, min_seconds: float):
    """Measure an extracted bundle's model with its target's settings and check the bundled budgets."""
    from edgeopt.device.budgets import Budgets
    from edgeopt.device.host import host_info
    from edgeopt.device.runtime import RuntimeSettings
    from edgeopt.device.validate import validate_artifact

    manifest, target = bundle.manifest, bundle.manifest["target"]
    try:
        settings = RuntimeSettings(**target["runtime"])
    except TypeError as exc:
        raise BadInputError(f"{bundle.path}: manifest target.runtime: {first_line(exc)}") from exc
    if importlib.util.find_spec(settings.runtime) is None:
        raise BadInputError(f"this device has no {settings.runtime} (the bundle needs {settings.runtime} "
                            f"{manifest['runtime']['version']}): pip install {RUNTIME_PACKAGES[settings.runtime]}")
    budgets = Budgets.from_dict(target["budgets"], source=f"{bundle.path}: manifest target.budgets")
    notes = [f"bundle {bundle.path.name} sha256 {bundle.sha256}"
             + (f", build {manifest['build_id']}" if manifest["build_id"] else "")]
    host = host_info()
    matches = target["device"].get("cpu_match") or []
    if matches and not any(m.lower() in host.cpu_model.lower() for m in matches):
        notes.append(f"this host's CPU ({host.cpu_model}) is not the profiled device's ({target['device'].get('cpu')})")
    shapes = {name: tuple(dims) for name, dims in target["input_shapes"].items()}
    report = validate_artifact(bundle.model_path, settings, budgets, runs=runs, warmup=warmup,
                               min_seconds=min_seconds, input_shapes=shapes, target=target["name"], notes=tuple(notes))
    packaged = manifest["runtime"]["version"]
    extra = [] if report.runtime_version == packaged else [
        f"validated at packaging with {settings.runtime} {packaged}; this device has {report.runtime_version}"]
    return replace(report, artifact=f"{bundle.path.name}:{manifest['model']}", notes=report.notes + extra)


def _text(bundle, report) -> str:
    from edgeopt.device.bundle_reader import summary

    lines = [summary(bundle)]
    for check in report.checks:
        measured = "not measured" if check.measured is None else f"{check.measured:.4g}{check.unit}"
        lines.append(f"  {'PASS' if check.passed else 'FAIL'}  {check.name}: {measured} "
                     f"(budget {check.budget:.4g}{check.unit})")
    lines.append(f"measured with: {report.measured_with()}")
    lines.extend(f"note: {note}" for note in report.notes)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

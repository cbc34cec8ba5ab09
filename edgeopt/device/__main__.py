"""The on-device validator: ``python -m edgeopt.device validate BUNDLE`` (console script ``edgeopt-device``).

Checks the bundle, extracts it to a temporary folder, measures its model with the target's runtime settings
in a separate process (latency distribution, peak RSS), checks the bundled budgets and writes JSON / JUnit.
Needs numpy and the one runtime the manifest names; no torch, nncf, click or rich. Plain text, no prompts.

With ``--trust PUBKEY`` (repeatable: PEM files or folders of them) a bundle must be signed by one of those
keys; the signature is checked (with ``cryptography``, else the ``openssl`` command) before anything is
extracted, and the check is refused, not skipped, when neither is there.

A bundle that carries a golden set (``edgeopt package --golden``) is also checked for quality: the model runs on
the golden inputs with the target's runtime settings and each output is compared with the reference within its
tolerance. The golden set's metric file (when it was shipped) runs only with ``--run-metric``: it is Python
from the bundle (check the bundle's signature with ``--trust`` first).

Exit codes: 0 ok, 1 internal error, 2 bad input (missing, tampered or truncated bundle, unsigned or not signed
by a trusted key, missing runtime, a failing metric), 3 a quality regression against the golden set (the worst
samples named), 4 a device budget failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from dataclasses import replace

from edgeopt import jsonio
from edgeopt.errors import BadInputError, BudgetError, EdgeoptError, QualityGateError, first_line

PROG = "edgeopt-device"
RUNTIME_PACKAGES = {"openvino": "openvino", "onnxruntime": "onnxruntime"}


def main(argv: list[str] | None = None) -> int:
    from edgeopt import signals

    args = _parser().parse_args(argv)
    try:
        with signals.handled():
            args.run(args)
        return 0
    except EdgeoptError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except signals.Terminated as exc:
        print(f"{PROG}: interrupted ({exc.name}); temporary files removed", file=sys.stderr)
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
    validate.add_argument("--lock", help="hold this device lock (flock on LOCK.0 ... LOCK.N-1) while measuring")
    validate.add_argument("--slots", type=_positive, default=1, help="measurements at once on this device (default 1)")
    validate.add_argument("--lock-timeout", type=float, default=3600.0,
                          help="seconds to wait for a free lock slot (default 3600)")
    validate.add_argument("--exit-on-stdin-eof", action="store_true",
                          help="stop when stdin closes (run over SSH: a dropped connection ends the measurement)")
    validate.add_argument("--max-extract-mb", type=float, default=None, help=_MAX_EXTRACT_HELP)
    validate.add_argument("--run-metric", action="store_true",
                          help="evaluate the task metric the bundle's golden set ships (runs its Python file)")
    validate.set_defaults(run=_validate)
    verify = commands.add_parser("verify", help="check checksums, manifest and signature only")
    verify.add_argument("bundle")
    for command in (validate, verify):
        command.add_argument("--trust", action="append", metavar="PUBKEY",
                             help="accept only a bundle signed by this Ed25519 public key (PEM file, or a folder of "
                                  "*.pem/*.pub); repeatable")
    verify.add_argument("--json", dest="json_out", help="write the result as JSON to this file ('-': stdout)")
    verify.add_argument("--quiet", action="store_true", help="print nothing but errors")
    verify.add_argument("--max-extract-mb", type=float, default=None, help=_MAX_EXTRACT_HELP)
    verify.set_defaults(run=_verify)
    return parser


_MAX_EXTRACT_HELP = ("largest total size of the bundle's files in MB (default: 100x the bundle's size, at least "
                     "64 MiB, at most 16 GiB)")


def _max_bytes(args) -> int | None:
    return None if args.max_extract_mb is None else int(args.max_extract_mb * 1e6)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _verify(args) -> None:
    from edgeopt.atomic import write_text
    from edgeopt.device.bundle_reader import describe, open_bundle, summary

    guard_reports(args)
    bundle = open_bundle(args.bundle, max_bytes=_max_bytes(args), trust=_trust(args))
    if args.json_out == "-":
        print(jsonio.dumps(describe(bundle), indent=2))
    elif args.json_out:
        write_text(args.json_out, jsonio.dumps(describe(bundle), indent=2) + "\n")
    if not args.quiet and args.json_out != "-":
        print(summary(bundle))


def _trust(args):
    from edgeopt.device.signature import load_trust

    return load_trust(args.trust) if args.trust else None


def _validate(args) -> None:
    import time

    from edgeopt.atomic import write_text
    from edgeopt.device.bundle_reader import open_bundle
    from edgeopt.device.reports import write_junit
    from edgeopt.device.session import exit_when_stdin_closes, take_device_lock

    guard_reports(args)
    if args.exit_on_stdin_eof:
        exit_when_stdin_closes()
    with tempfile.TemporaryDirectory(prefix="edgeopt-bundle-") as tmp:
        bundle = open_bundle(args.bundle, extract_to=tmp, max_bytes=_max_bytes(args), trust=_trust(args))
        lock, waited = take_device_lock(args.lock, args.slots, args.lock_timeout) if args.lock else (None, 0.0)
        started = time.time()
        report = validate_bundle(bundle, args.runs, args.warmup, args.min_seconds)
        report = check_golden(bundle, report, args.run_metric)
        session = {"lock": lock, "lock_wait_s": round(waited, 3), "started_unix": started, "ended_unix": time.time()}
    if args.json_out:
        data = device_result(report, bundle, session)
        text = jsonio.dumps(data, indent=2)  # a golden output's inf error is null
        if args.json_out == "-":
            print(text)
        else:
            write_text(args.json_out, text + "\n")
    if args.junit_out:
        write_junit(report, args.junit_out)
    if not args.quiet and args.json_out != "-":
        print(_text(bundle, report))
    if report.golden is not None and not report.golden["passed"]:
        from edgeopt.device.golden import golden_message

        raise QualityGateError(f"quality regression: {golden_message(report.golden)}")
    failed = [c.name for c in report.checks if not c.passed]
    if failed:
        raise BudgetError(f"device budget failed: {', '.join(failed)} (target {report.target})")


RESULT_SCHEMA = "edgeopt-device-result/1"


def device_result(report, bundle, session: dict) -> dict:
    """The validation report as the device writes it: with the bundle's sha256 (so a result cannot be
    attached to another artifact) and when and under which lock it was measured."""
    manifest = bundle.manifest
    own = {k: v for k, v in report.to_dict().items() if k not in ("schema_version", "report")}
    return {"schema_version": RESULT_SCHEMA, **own,
            "bundle": {"file": bundle.path.name, "sha256": bundle.sha256, "build_id": manifest["build_id"],
                       "model": manifest["model"], "target": manifest["target"]["name"]},
            "session": session, "timings_ms": list(report.timings_ms)}


def guard_reports(args) -> None:
    """Refuse, before any work, report paths that are folders or files edgeopt did not write."""
    from edgeopt.out_guard import check_out_file, is_own_report

    for option, path in (("--json", args.json_out), ("--junit", getattr(args, "junit_out", None))):
        if path and path != "-":
            check_out_file(path, option=option, own=is_own_report)


def validate_bundle(bundle, runs: int, warmup: int, min_seconds: float):
    """Measure an extracted bundle's model with its target's settings and check the bundled budgets."""
    from edgeopt.device.budgets import Budgets, mark_emulated
    from edgeopt.device.host import host_info, not_the_device
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
    other = not_the_device(target["device"], host.machine, host.cpu_model, host.usable_cpus)
    if settings.threads and settings.threads > host.usable_cpus:
        notes.append(f"the profile runs {settings.threads} threads but this host has {host.usable_cpus} usable CPUs")
    shapes = {name: tuple(dims) for name, dims in target["input_shapes"].items()}
    report = validate_artifact(bundle.model_path, settings, budgets, runs=runs, warmup=warmup,
                               min_seconds=min_seconds, input_shapes=shapes, target=target["name"], notes=tuple(notes),
                               emulation_note=f"not the profiled device ({target['device']['name']}): {other}; "
                                              f"the figures are this host's" if other else None)
    if other:
        report = replace(report, checks=mark_emulated(report.checks, report.emulation_note,
                                                      memory=target["device"].get("arch") != host.machine))
    packaged = manifest["runtime"]["version"]
    extra = [] if report.runtime_version == packaged else [
        f"validated at packaging with {settings.runtime} {packaged}; this device has {report.runtime_version}"]
    return replace(report, artifact=f"{bundle.path.name}:{manifest['model']}", notes=report.notes + extra)


def check_golden(bundle, report, run_metric: bool):
    """The bundle's model against the golden set it carries (none: the report unchanged), run with the target's
    settings; the shipped metric only with ``run_metric``."""
    from edgeopt.device.golden import compare, load_golden, load_metric_file, session_predict
    from edgeopt.device.runtime import RuntimeSettings, open_session

    entry = bundle.manifest.get("golden")
    if entry is None:
        return report
    golden = load_golden(bundle.root / entry["path"])
    session = open_session(bundle.model_path, RuntimeSettings(**bundle.manifest["target"]["runtime"]))
    function = load_metric_file(golden) if run_metric else None
    spec = golden.metric_spec
    if function is not None:  # named after the shipped file, so a failing metric names what ran
        spec = replace(spec, name=f"{entry['path']}/{golden.metric['file']}:{golden.metric['function']}")
    result = compare(golden, session_predict(session, golden), function, spec)
    described = result.describe()
    described["golden"] = f"{bundle.path.name}:{entry['path']}"
    if golden.metric is not None and function is None:
        hint = "pass --run-metric to evaluate it" if golden.metric_file else "its file was not shipped"
        described["notes"] = [f"metric {golden.metric['primary']} not evaluated on the device ({hint}); per-output "
                              f"tolerances only"]
    return replace(report, golden=described)


def _text(bundle, report) -> str:
    from edgeopt.device.bundle_reader import summary

    lines = [summary(bundle)]
    for check in report.checks:
        measured = "not measured" if check.measured is None else f"{check.measured:.4g}{check.unit}"
        lines.append(f"  {check.verdict}  {check.name}: {measured} "
                     f"(budget {check.budget:.4g}{check.unit})")
    lines.append(f"measured with: {report.measured_with()}")
    lines.extend(f"note: {note}" for note in report.notes)
    if report.golden is not None:
        golden = report.golden
        outputs = ", ".join(f"{o['name']} cosine {o['cosine']:.5f} (min {o['tolerance']['min_cosine']})"
                            for o in golden["outputs"])
        lines.append(f"  {'PASS' if golden['passed'] else 'FAIL'}  golden set ({golden['samples']} samples): {outputs}")
        if golden["metric"] is not None:
            m = golden["metric"]
            lines.append(f"  {'PASS' if m['passed'] else 'FAIL'}  metric {m['primary']}: {m['value']:.6g} vs "
                         f"{m['reference']:.6g} (drop {m['drop']:.4g}, max {m['threshold']:.4g})")
        lines.extend(f"note: {note}" for note in golden["notes"])
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

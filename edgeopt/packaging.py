"""Package a compressed artifact for a device: pick its model files, validate it with the target's settings
(or take a validation report measured before), assemble the manifest and write the bundle.

The bundle is a function of its inputs only: the model files, the target profile, the validation report,
the compress report, the preprocessing, ``build_id``, the tool versions and the signing key. Measuring again
gives other latency figures and so another bundle; pass the report (``report=``) to rebuild byte-identical
bundles.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from edgeopt import __version__
from edgeopt.bundle_writer import file_entry, write_bundle
from edgeopt.device.bundle_reader import SCHEMA, canonical_json, check_member_name
from edgeopt.device.formats import FILE_FORMATS, file_format
from edgeopt.device.golden import FILES as GOLDEN_FILES
from edgeopt.device.golden import GoldenSet, load_golden
from edgeopt.device.runtime import RuntimeSettings, open_session, runtime_for
from edgeopt.errors import BadInputError, BudgetError, QualityGateError, first_line
from edgeopt.provenance import STATEMENT, bundle_provenance, statement
from edgeopt.targets import Measuring, Target, load_target, model_in, validate_on

VALIDATION = "validation.json"
COMPRESS_REPORT = "compress_report.json"
GOLDEN_DIR = "golden"  # where a golden set lives inside a bundle


class NotPackaged(BudgetError):
    """A budget failed, so no bundle was written; carries the validation that failed (``validation``, as in a
    bundle's ``validation.json``) and, when it was measured here, the ``ValidationReport`` (``report``)."""

    def __init__(self, message: str, *, validation: dict, report=None):
        super().__init__(message)
        self.validation = validation
        self.report = report

    def describe(self) -> dict:
        return {"packaged": False, "bundle": None, "exit_code": self.exit_code, "error": str(self),
                "validation": self.validation}


@dataclass(frozen=True)
class PackageResult:
    path: Path
    manifest: dict
    bytes: int
    sha256: str
    golden: dict[str, dict] | None = None  # per bundled model: its check against the golden set (--golden)

    def describe(self) -> dict:
        return {"packaged": True, "bundle": str(self.path), "bytes": self.bytes, "sha256": self.sha256,
                "manifest": self.manifest,
                **({"golden": self.golden} if self.golden is not None else {})}


def package(artifact: str | Path, target: str | Path | Target, out: str | Path, *,
            formats: tuple[str, ...] | None = None, report: str | Path | dict | None = None,
            build_id: str | None = None,
            preprocess: str | Path | None = None, input_shapes: dict[str, tuple[int, ...]] | None = None,
            measuring: Measuring = Measuring(), sign=None, golden: str | Path | None = None) -> PackageResult:
    """Validate ``artifact`` (a model file or an ``edgeopt compress`` folder) on ``target`` and write the
    bundle to ``out``. ``input_shapes`` fill dynamic dimensions (over the target's). Raises ``QualityGateError`` when
    the compress report's gate failed or a bundled model regresses against ``golden``, and ``NotPackaged`` (a
    ``BudgetError`` with the failed validation) when a budget fails; nothing is written then. ``report``: a
    validation report (file or ``to_dict()``) of this model on this target, used instead of measuring again.
    ``sign``: a ``edgeopt.signing.Signer``, or the private key (file, or ``env:NAME``) to make one with, to sign
    the manifest. ``golden``: a golden set folder to ship in the bundle (listed, checksummed and signed with the
    rest), after every bundled model is checked against it here (as ``edgeopt validate --golden`` does); the device
    validator checks the model against it again."""
    from edgeopt.device.bundle_reader import open_bundle
    from edgeopt.signing import Signer
    from edgeopt.versions import tool_versions

    target = target if isinstance(target, Target) else load_target(target)
    if build_id is not None and (not build_id or len(build_id) > 200 or not build_id.isprintable()):
        raise BadInputError(f"--build-id must be 1-200 printable characters, got {build_id!r}")
    artifact = Path(artifact)
    if not artifact.exists():
        raise BadInputError(f"{artifact}: no such artifact")
    signer = sign if sign is None or isinstance(sign, Signer) else Signer(sign)  # a bad key fails before measuring
    golden_set = load_golden(golden) if golden is not None else None  # a bad golden set fails before measuring
    primary = model_in(artifact, target.settings.runtime)
    compress_report, compress_report_path = _compress_report(artifact)
    models = _models(artifact, primary, formats, target.settings.runtime)
    _check_gate(compress_report, compress_report_path, models)
    checked_golden = _check_golden(golden_set, models, primary, target) if golden_set is not None else None
    measured = None if report is not None else validate_on(target, primary, measuring=measuring,
                                                             input_shapes=input_shapes)
    validation = _load_report(report, primary, target) if measured is None else measured.to_dict()
    if not validation["passed"]:
        failed = ", ".join(c["name"] for c in validation["checks"] if not c["passed"])
        raise NotPackaged(f"{primary}: device budget failed on {target.name} ({failed}); not packaged",
                          validation=validation, report=measured)
    validation = validation | {"artifact": primary.name}
    files: dict[str, bytes | Path] = {f.name: f for model in models for f in _model_files(model)}
    files[VALIDATION] = canonical_json(validation)
    companions = _companions(compress_report, compress_report_path)
    clash = {n for n in companions if n in files or n in (COMPRESS_REPORT, STATEMENT) or n.startswith(f"{GOLDEN_DIR}/")}
    if clash:
        raise BadInputError(f"{artifact}: a companion file is named like a bundle file ({', '.join(sorted(clash))})")
    files |= companions
    if compress_report is not None:
        files[COMPRESS_REPORT] = compress_report_path
    provenance = bundle_provenance(compress_report, target, tool_versions())
    subjects = {f.name: file_entry(f) for model in models for f in _model_files(model)}
    subjects |= {name: file_entry(path) for name, path in companions.items()}
    if golden_set is not None:
        golden_files = {f"{GOLDEN_DIR}/{name}": golden_set.root / name for name in GOLDEN_FILES
                        if (golden_set.root / name).is_file()}
        files |= golden_files
        subjects |= {name: file_entry(path) for name, path in golden_files.items()}
    files[STATEMENT] = canonical_json(statement(provenance, subjects, build_id))
    manifest = {
        "schema": SCHEMA,
        "edgeopt_version": __version__,
        "build_id": build_id,
        "target": {"name": target.name, "description": target.description, "device": asdict(target.device),
                   "runtime": target.settings.describe(), "budgets": target.budgets.describe(),
                   "input_shapes": validation["measured_with"]["input_shapes"]},
        "runtime": {"name": target.settings.runtime, "version": validation["measured_with"]["runtime_version"]},
        "model": primary.name,
        "models": [_describe_model(m, primary, target.settings.runtime, compress_report) for m in models],
        "recipe": compress_report["recipe"] if compress_report else None,
        "preprocessing": _preprocessing(preprocess),
        "quality": _quality(compress_report, models),
        "validation": {"passed": validation["passed"], "checks": validation["checks"],
                       "measured": {"latency_ms": validation["latency_ms"], "memory": validation["memory"],
                                    "artifact_bytes": validation["artifact_bytes"],
                                    "first_inference_ms": validation["first_inference_ms"],
                                    "load_compile_ms": validation["load_compile_ms"]},
                       "measured_with": validation["measured_with"]["summary"],
                       "emulated": validation["emulated"], "report": VALIDATION},
        "provenance": provenance,
        "golden": _golden_entry(golden_set),
    }
    path = write_bundle(out, manifest, files, sign=signer)
    checked = open_bundle(path, trust=(signer.public_key,) if signer else None)
    return PackageResult(path, checked.manifest, path.stat().st_size, checked.sha256, checked_golden)


def _check_golden(golden: GoldenSet, models: list[Path], primary: Path, target: Target) -> dict[str, dict]:
    """Every bundled model against the golden set (the primary with the target's settings, another format in its
    native runtime); a regression raises ``QualityGateError`` before anything is measured or written."""
    from edgeopt.golden import check_golden

    results = {}
    for model in models:
        settings = target.settings if model == primary else RuntimeSettings(runtime=runtime_for(model))
        result = check_golden(golden, model, settings)
        if not result.passed:
            raise QualityGateError(f"{model.name}: quality regression: {result.message()}; not packaged")
        results[model.name] = result.describe()
    return results


def _golden_entry(golden: GoldenSet | None) -> dict | None:
    if golden is None:
        return None
    metric = golden.metric
    return {"path": GOLDEN_DIR, "samples": golden.manifest["samples"],
            "metric": metric["primary"] if metric else None, "metric_file": golden.metric_file is not None}


def _models(artifact: Path, primary: Path, formats: tuple[str, ...] | None, runtime: str) -> list[Path]:
    """The primary model first, then any other formats asked for (from the same folder)."""
    if not formats:
        return [primary]
    models = [primary]
    for fmt in formats:
        if fmt not in FILE_FORMATS:
            raise BadInputError(f"--format: unknown format '{fmt}' (use {', '.join(FILE_FORMATS)})")
        suffix = FILE_FORMATS[fmt].suffix
        if primary.suffix.lower() == suffix:
            continue
        folder = artifact if artifact.is_dir() else artifact.parent
        found = sorted(folder.glob(f"*{suffix}"))
        if len(found) != 1:
            raise BadInputError(f"{folder}: needs exactly one {suffix} model for --format {fmt}, found {len(found)}")
        models.append(found[0])
    if primary.suffix.lower() not in [FILE_FORMATS[f].suffix for f in formats]:
        raise BadInputError(f"--format {','.join(formats)} leaves out {primary.name}, the model {runtime} runs")
    return models


def _model_files(model: Path) -> list[Path]:
    files = list(file_format(model).files(model))
    for companion in files[1:]:
        if companion.parent != model.parent:
            raise BadInputError(f"{model}: its external data {companion.relative_to(model.parent)} is not beside "
                                f"it; a bundle holds a model's files side by side (save the data next to the model)")
        if not companion.is_file():
            raise BadInputError(f"{model}: the weights file {companion.name} is missing")
    return files


def _describe_model(model: Path, primary: Path, runtime: str, compress_report: dict | None) -> dict:
    runtime = runtime if model == primary else runtime_for(model)
    session = open_session(model, RuntimeSettings(runtime=runtime))
    precision = None
    for entry in (compress_report or {}).get("artifacts", []):
        if entry.get("path") == model.name:
            precision = entry.get("precision")
    return {"path": model.name, "format": file_format(model).name,
            "runtime": runtime, "precision": precision, "files": [f.name for f in _model_files(model)],
            "inputs": [_tensor(t) for t in session.inputs], "outputs": [_tensor(t) for t in session.outputs]}


def _tensor(spec) -> dict:
    return {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype}


def _compress_report(artifact: Path) -> tuple[dict | None, Path | None]:
    """The ``report.json`` of the ``edgeopt compress`` that wrote the artifact, and its path: the folder's, or for
    a model file the one beside it that lists the file among its artifacts (so packaging one file of a compress
    folder keeps its quality gate); (None, None) when there is none. Its quality gate must have passed."""
    path = artifact / "report.json" if artifact.is_dir() else artifact.parent / "report.json"
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        if not artifact.is_dir():
            return None, None  # a file of the user's beside the model, not edgeopt's
        raise BadInputError(f"{path}: not a readable compress report ({first_line(exc)})") from exc
    if isinstance(data, dict) and data.get("report") == "optimize":  # the folder optimize wrote, or a file of it
        folder = artifact if artifact.is_dir() else artifact.parent
        if artifact.is_dir() or artifact.name in (data.get("chosen_files") or []):
            return _chosen_compress_report(folder, data, path)
        return None, None
    if not artifact.is_dir() and not (isinstance(data, dict) and "recipe" in data and any(
            isinstance(entry, dict) and entry.get("path") == artifact.name and _same_file(artifact, entry)
            for entry in data.get("artifacts") or [])):
        return None, None  # not the report of this file (hashed only when the file is packaged alone)
    if not isinstance(data, dict) or "recipe" not in data:
        raise BadInputError(f"{path}: not a compress report (no 'recipe')")
    return data, path


def _chosen_compress_report(folder: Path, optimize: dict, path: Path) -> tuple[dict, Path]:
    """For the folder ``edgeopt optimize`` wrote: the compress report of the artifact it chose, from the cache entry
    that built it (its quality gate, provenance and recipe), once the folder's model files are checked to be that
    artifact's files."""
    chosen = next((c for c in optimize.get("candidates") or [] if c.get("label") == optimize.get("chosen")), None)
    if chosen is None or not chosen.get("artifact"):
        raise BadInputError(f"{path}: optimize chose no artifact (verdict: {optimize.get('verdict')}); nothing to "
                            f"package")
    entry = Path(chosen["artifact"]).parent / "report.json"
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise BadInputError(f"{path}: the compress report of optimize's choice ({entry}) is gone or unreadable; "
                            f"run optimize again, or package {chosen['artifact']}") from None
    from edgeopt.file_digest import sha256_file

    chosen_files = set(optimize.get("chosen_files") or [])
    recorded = {name: value.get("sha256") for a in data.get("artifacts") or [] if isinstance(a, dict)
                for name, value in (a.get("files") or {}).items() if name in chosen_files and isinstance(value, dict)}
    for name, sha256 in recorded.items():
        if not (folder / name).is_file() or sha256_file(folder / name) != sha256:
            raise BadInputError(f"{folder / name}: not the file optimize chose (missing, or its sha256 differs "
                                f"from {entry}'s)")
    return data, entry


def _check_gate(compress_report: dict | None, path: Path | None, models: list[Path]) -> None:
    """Refuse (``QualityGateError``) a bundled model whose format failed the compress run's quality gate or golden
    set; another format's failure does not stop this one."""
    failed = _failed_gate(compress_report, models)
    if failed is not None:
        raise QualityGateError(f"{path}: {failed.name} failed its quality gate; not packaged")


def _failed_gate(compress_report: dict | None, models: list[Path]) -> Path | None:
    """The first of ``models`` whose format failed the compress run's quality gate or golden set, if any."""
    quality = (compress_report or {}).get("quality") or {}
    for model in models:
        fmt = file_format(model).name
        verdicts = [entry.get("passed") for entry in ((quality.get("artifacts") or {}).get(fmt),
                                                      (quality.get("golden") or {}).get(fmt)) if entry]
        if False in verdicts or (not verdicts and quality.get("passed") is False):
            return model
    return None


def gate_failure(artifact: Path, model: Path) -> str | None:
    """Why the ``edgeopt compress`` run that wrote ``model`` (``artifact``: its folder, or the file itself) refused
    it at its quality gate, or None (it passed, was not gated, or no readable compress report says so)."""
    try:
        compress_report, path = _compress_report(artifact)
    except BadInputError:  # another tool's report.json, or an optimize folder whose cache entry is gone
        return None
    if _failed_gate(compress_report, [model]) is None:
        return None
    return f"{model.name} failed its quality gate when edgeopt compress wrote it ({path})"


def _same_file(model: Path, entry: dict) -> bool:
    """Whether a compress report's artifact entry describes ``model`` as it is now (its sha256, where recorded)."""
    from edgeopt.file_digest import sha256_file

    recorded = (entry.get("files") or {}).get(model.name)
    return not isinstance(recorded, dict) or recorded.get("sha256") in (None, sha256_file(model))


def _companions(compress_report: dict | None, path: Path | None) -> dict[str, Path]:
    """The files the compress report says its artifacts need beside them (a Hugging Face folder's config and
    tokenizer), by bundle name; each must still be there."""
    found = {}
    for name in (compress_report or {}).get("companions") or []:
        if not isinstance(name, str):
            raise BadInputError(f"{path}: companions: expected file names, got {name!r}")
        check_member_name(name, str(path))
        companion = path.parent / name
        if not companion.is_file():
            raise BadInputError(f"{path.parent}: {name}, which the artifacts need beside them, is missing")
        found[name] = companion
    return found


def _quality(compress_report: dict | None, models: list[Path]) -> dict | None:
    quality = (compress_report or {}).get("quality")
    if not quality or not quality.get("original"):
        return None
    names = {file_format(m).name for m in models}
    return {"gate": quality.get("gate"), "original": quality.get("original"),
            "evaluated_with": quality.get("evaluated_with"),
            "artifacts": {k: v for k, v in (quality.get("artifacts") or {}).items() if k in names}}


def _preprocessing(path: str | Path | None) -> dict | None:
    if path is None:
        return None
    from edgeopt.data import Preprocess

    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no such preprocessing file")
    return asdict(Preprocess.load(path))


def _load_report(source: str | Path | dict, primary: Path, target: Target) -> dict:
    """A validation report (``edgeopt validate --json``) of this very model, target and budgets."""
    from edgeopt.device.validate import artifact_files

    path = "validation report" if isinstance(source, dict) else Path(source)
    try:
        data = source if isinstance(source, dict) else json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"{path}: not a readable validation report ({first_line(exc)})") from exc
    needed = ("target", "files", "passed", "checks", "budgets", "latency_ms", "memory", "artifact_bytes",
              "first_inference_ms", "load_compile_ms", "measured_with", "emulated")
    if not isinstance(data, dict) or any(key not in data for key in needed):
        raise BadInputError(f"{path}: not a validation report of one artifact (from `edgeopt validate --json`)")
    if data["target"] != target.name or data["budgets"] != target.budgets.describe():
        raise BadInputError(f"{path}: measured for target '{data['target']}' with other budgets, not '{target.name}'")
    if data["files"] != artifact_files(primary):
        raise BadInputError(f"{path}: measured on other model files ({data['files']}), not {primary.name}")
    return data

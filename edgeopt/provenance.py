"""Provenance: what an artifact was built from and with, recorded by ``compress`` and carried into bundles.

``compress`` records its inputs (``describe_inputs``) in ``report.json``: the source model's files and sha256
(plus a digest of the weights as loaded, for PyTorch), and for each data set its file (or folder) digest, sample
count and a digest of the samples as loaded. ``package`` turns that report, the target profile and the tool
versions into the manifest's ``provenance`` and an in-toto Statement (SLSA provenance v1 predicate) stored in the
bundle as ``provenance.intoto.json`` — covered by the manifest's sha256 list and so by its signature.

Folder digest: sha256 over ``relative/path\\0<sha256 of the file>\\n`` lines of every file, sorted by path.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from edgeopt.device.formats import file_format, model_suffixes
from edgeopt.file_digest import sha256_file
from edgeopt.user_code import is_function_spec

STATEMENT = "provenance.intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:edgeopt:package:v1"
BUILDER_ID = "urn:edgeopt:cli"
DATA_ROLES = ("calibration", "evaluation", "training")


def describe_inputs(model: str | Path, source, data: dict) -> dict:
    """The ``inputs`` record of a compress report. ``source``: the loaded ``SourceModel``; ``data``: role ->
    ``(spec, SampleSet)`` or ``None``, for the roles in ``DATA_ROLES``."""
    return {"model": _model_record(str(model), source),
            **{role: (_data_record(*data[role]) if data.get(role) else None) for role in DATA_ROLES}}


def _model_record(spec: str, source) -> dict:
    path = Path(spec.rpartition(":")[0] if is_function_spec(spec) else spec)
    files = file_format(path).files(path) if path.suffix.lower() in model_suffixes() else [path]
    record = {"name": _name(spec), "files": ({p.name: sha256_file(p) for p in files if p.is_file()} if path.is_file()
                                             else _folder_files(path))}
    record["weights_sha256"] = _weights_digest(source.torch_module) if source.kind == "torch" else None
    return record


def _data_record(spec, samples) -> dict:
    text = str(spec)
    path = Path(text.rpartition(":")[0] if is_function_spec(text) else text)
    digest = folder_digest(path) if path.is_dir() else sha256_file(path)
    return {"name": _name(text), "sha256": digest, "samples": len(samples), "samples_sha256": samples_digest(samples)}


def _name(spec: str) -> str:
    """A spec without its folders: the record stays the same wherever the build runs."""
    head, sep, tail = spec.rpartition(":")
    return f"{Path(head).name}:{tail}" if is_function_spec(spec) else Path(spec).name


def _folder_files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def folder_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for name, value in _folder_files(folder).items():
        digest.update(f"{name}\0{value}\n".encode())
    return digest.hexdigest()


def samples_digest(samples) -> str:
    """sha256 over every sample's arrays (name, dtype, shape, bytes) in order, then the labels."""
    import numpy as np

    digest = hashlib.sha256()
    for sample in samples.samples:
        for name in sorted(sample):
            _update(digest, name, np.asarray(sample[name]))
    if samples.labels is not None:
        _update(digest, "labels", np.asarray(samples.labels))
    return digest.hexdigest()


def _weights_digest(module) -> str:
    """sha256 over the module's state dict (name, dtype, shape, bytes of every tensor), in its order; a
    ``torch.export`` program holds its state dict as an attribute."""
    import torch

    state = module.state_dict() if callable(module.state_dict) else module.state_dict
    digest = hashlib.sha256()
    for name, tensor in state.items():
        array = tensor.detach().cpu().contiguous()
        digest.update(f"{name}\0{array.dtype}\0{list(array.shape)}\0".encode())
        digest.update(array.view(-1).view(torch.uint8).numpy().tobytes() if array.numel() else b"")
    return digest.hexdigest()


def _update(digest, name: str, array) -> None:
    array = array if array.flags.c_contiguous else array.copy(order="C")
    digest.update(f"{name}\0{array.dtype.str}\0{list(array.shape)}\0".encode())
    digest.update(array.tobytes())


def profile_digest(target) -> str:
    """sha256 of the resolved profile (every inherited value filled in) as canonical JSON, without its path."""
    from edgeopt.device.bundle_reader import canonical_json

    described = target.describe()
    described.pop("source")
    return hashlib.sha256(canonical_json(described)).hexdigest()


def bundle_provenance(compress_report: dict | None, target, package_tools: dict) -> dict:
    """The manifest's ``provenance``: inputs, recipe and tools from the compress report (``None`` when packaging
    a bare model file), the target profile's digest, and the tools that packaged it."""
    report = compress_report or {}
    inputs = report.get("inputs") or {}
    return {"source_model": inputs.get("model"), "data": {role: inputs.get(role) for role in DATA_ROLES},
            "recipe": report.get("recipe_steps"),
            "tools": {"compress": report.get("versions"), "package": package_tools},
            "target": {"name": target.name, "sha256": profile_digest(target)}, "statement": STATEMENT}


def statement(provenance: dict, subjects: dict[str, dict], build_id: str | None) -> dict:
    """An in-toto Statement v1 with a SLSA provenance v1 predicate: ``subjects`` (file name -> ``{"sha256"}``)
    are the bundled model files; the source model, data and profile are its resolved dependencies."""
    dependencies = []
    model = provenance["source_model"]
    if model:
        dependencies += [{"name": f"model/{name}", "digest": {"sha256": value}}
                         for name, value in model["files"].items()]
    for role, record in provenance["data"].items():
        if record:
            dependencies.append({"name": f"{role}/{record['name']}", "digest": {"sha256": record["sha256"]}})
    target = provenance["target"]
    dependencies.append({"name": f"target/{target['name']}", "digest": {"sha256": target["sha256"]}})
    tools = provenance["tools"]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": entry["sha256"]}} for name, entry in sorted(subjects.items())],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {"buildType": BUILD_TYPE,
                                "externalParameters": {"recipe": provenance["recipe"], "target": target["name"],
                                                       "build_id": build_id},
                                "resolvedDependencies": dependencies},
            "runDetails": {"builder": {"id": BUILDER_ID, "version": tools["compress"] or tools["package"]},
                           "metadata": {"invocationId": build_id or ""}},
        },
    }


def show(manifest: dict) -> list[str]:
    """Plain lines for ``edgeopt verify --show``."""
    provenance = manifest.get("provenance")
    if provenance is None:
        return [f"provenance: none recorded (bundle schema {manifest['schema']})"]
    lines = []
    model = provenance["source_model"]
    if model:
        files = ", ".join(f"{name} {value}" for name, value in model["files"].items())
        weights = f"; weights as loaded {model['weights_sha256']}" if model["weights_sha256"] else ""
        lines.append(f"source model: {model['name']} (sha256 {files}{weights})")
    else:
        lines.append("source model: not recorded (the artifact had no `edgeopt compress` report listing its inputs)")
    for role, record in provenance["data"].items():
        if record:
            lines.append(f"{role} data: {record['name']} sha256 {record['sha256']}, {record['samples']} samples "
                         f"(as loaded: {record['samples_sha256']})")
    recipe = provenance["recipe"]
    lines.append("recipe: " + (", ".join(_step(s) for s in recipe) or "none (FP32)" if recipe is not None
                               else "not recorded"))
    for stage, tools in provenance["tools"].items():
        if tools:
            lines.append(f"tools ({stage}): " + ", ".join(f"{name} {value}" for name, value in tools.items()))
    target = provenance["target"]
    lines.append(f"target profile: {target['name']} (resolved profile sha256 {target['sha256']})")
    lines.append(f"build id: {manifest['build_id'] or 'none'}")
    lines.append(f"provenance statement: {provenance['statement']} (in-toto Statement v1, SLSA provenance v1)")
    return lines


def _step(step: dict) -> str:
    params = ", ".join(f"{k}={v}" for k, v in sorted(step["params"].items()))
    return f"{step['name']}({params})" if params else step["name"]

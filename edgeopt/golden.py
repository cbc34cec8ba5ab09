"""``edgeopt golden create``: store a small set of inputs with the reference model's outputs and its task metric's
value, and check artifacts against it on the build host (the format and the check: ``edgeopt.device.golden``)."""

from __future__ import annotations

import ast
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeopt import atomic, jsonio
from edgeopt.data import load_samples, sample_shapes
from edgeopt.device.golden import (ARRAYS, MANIFEST, METRIC_FILE, SCHEMA, TARGETS, GoldenResult, GoldenSet,
                                   Tolerance, compare, encode, load_metric_file, session_predict)
from edgeopt.device.runtime import RuntimeSettings, open_session
from edgeopt.device.task_metric import MetricSpec
from edgeopt.errors import BadInputError

DEFAULT_SAMPLES = 32
LEAN_IMPORTS = {"numpy", "edgeopt"}  # besides the standard library: what a metric may import to be shipped


@dataclass(frozen=True)
class GoldenCreated:
    out: Path
    samples: int
    metric: dict | None  # golden.json's metric record
    shipped_metric: bool
    notes: list[str]

    def describe(self) -> dict:
        return {"golden": str(self.out), "samples": self.samples, "metric": self.metric,
                "shipped_metric": self.shipped_metric, "notes": self.notes}


def create_golden(model: str | Path, data: str | Path, out: str | Path, *, metric: MetricSpec | None = None,
                  samples: int = DEFAULT_SAMPLES, min_cosine: float = 0.99,
                  max_abs_error: dict[str, float] | None = None, input_shapes: dict | None = None,
                  batch_axes: dict | None = None) -> GoldenCreated:
    """Run the reference ``model`` on the first ``samples`` of ``data`` and write the golden set to ``out``
    (atomically). Every output gets ``min_cosine``; ``max_abs_error`` adds an absolute bound per output name."""
    from edgeopt.evaluate import EVAL_SETTINGS, all_outputs, original_predictor
    from edgeopt.source import load_model

    source = load_model(model, input_shapes or {}, batch_axes or {},
                        data_shapes=lambda specs: sample_shapes(data, specs))
    evaluation = load_samples(data, source.inputs, source.tokenizer).take(samples)
    reference = all_outputs(original_predictor(source, EVAL_SETTINGS), evaluation, source.output_names)
    bounds = dict(max_abs_error or {})
    unknown = sorted(set(bounds) - set(reference.names))
    if unknown:
        raise BadInputError(f"--max-abs-error names unknown output(s) {', '.join(unknown)}; the model's outputs are "
                            f"{', '.join(reference.names)}")
    per_sample = reference.per_sample()
    arrays = {f"input:{name}": np.stack([s[name] for s in evaluation.samples]) for name in source.input_names}
    arrays |= {f"output:{name}": np.stack([s[name] for s in per_sample]) for name in reference.names}
    targets = evaluation.targets
    manifest = {
        "schema": SCHEMA, "samples": len(evaluation),
        "source": {"model": str(model), "data": str(data)},
        "inputs": [{"name": n, "shape": list(arrays[f"input:{n}"].shape[1:]), "dtype": str(arrays[f"input:{n}"].dtype)}
                   for n in source.input_names],
        "outputs": [{"name": n, "shape": list(s), "dtype": str(arrays[f"output:{n}"].dtype),
                     "tolerance": Tolerance(min_cosine, bounds.get(n)).describe()}
                    for n, s in zip(reference.names, reference.shapes)],
        "targets": TARGETS if targets is not None else None,
        "metric": None,
    }
    notes = []
    shipped = False
    if metric is not None:
        from edgeopt.user_metric import evaluate_metric

        values = evaluate_metric(metric, per_sample, targets)
        path, _, function = metric.name.rpartition(":")
        unlean = _unlean_imports(Path(path))
        shipped = not unlean
        if unlean:
            notes.append(f"metric {metric.name} not shipped in the golden set (it imports {', '.join(unlean)}; a "
                         f"device has numpy and the runtime only): devices check the per-output tolerances")
        manifest["metric"] = {**metric.describe(), "function": function, "file": METRIC_FILE if shipped else None,
                              "reference": values.describe()}
    out = Path(out)
    with atomic.atomic_dir(out) as tmp:
        with open(tmp / ARRAYS, "wb") as handle:
            np.savez(handle, **arrays)
        if targets is not None:
            atomic.write_text(tmp / TARGETS, jsonio.dumps({"schema": SCHEMA, "targets": encode(list(targets))}))
        if shipped:
            shutil.copyfile(metric.name.rpartition(":")[0], tmp / METRIC_FILE)
        atomic.write_text(tmp / MANIFEST, jsonio.dumps(manifest, indent=2))
    return GoldenCreated(out, len(evaluation), manifest["metric"], shipped, notes)


def check_golden(golden: GoldenSet, artifact: Path, settings: RuntimeSettings,
                 metric: MetricSpec | None = None) -> GoldenResult:
    """An artifact (a model file) against a golden set, run in ``settings``; the metric is ``metric`` (a
    ``--metric`` given now), else the set's shipped file, else its original file when it is still there."""
    from edgeopt.user_metric import metric_function

    function = None
    if metric is not None:
        function = metric_function(metric.name)
    elif golden.metric is not None:
        function = load_metric_file(golden)
        original = golden.metric["name"]
        if function is None and Path(original.rpartition(":")[0]).is_file():
            function = metric_function(original)
    return compare(golden, session_predict(open_session(artifact, settings), golden), function, metric)


def _unlean_imports(path: Path) -> list[str]:
    """Top-level modules ``path`` imports beyond numpy, edgeopt and the standard library."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ["(unreadable)"]
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            modules.add("." * node.level + (node.module or ""))
    return sorted(m for m in modules if m not in LEAN_IMPORTS and m not in sys.stdlib_module_names)

"""Golden sets: a few inputs with the reference model's outputs (and its task metric's value), and the check of
an artifact against them — per-output tolerances, the metric threshold, the worst samples named (docs/golden.md).

A golden set is a folder (``edgeopt golden create``; also inside a device bundle under ``golden/``):

- ``golden.json``: schema ``edgeopt-golden/1``; the inputs and outputs (name, shape, dtype), each output's
  tolerance (``min_cosine``: mean over samples of the cosine to the reference; ``max_abs_error``: the largest
  absolute difference anywhere, or null), and the metric (its declaration, reference values and, when shipped,
  the file holding it);
- ``golden.npz``: ``input:NAME`` and ``output:NAME`` arrays, samples stacked on axis 0;
- ``targets.json``: ``{"schema", "targets"}``: each sample's target (arrays encoded with their dtype and shape),
  when the data had targets;
- ``metric.py``: the metric function's file, when it imports only numpy and the standard library.

Lean module (numpy, the standard library and the runtime session): the on-device validator uses it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeopt.device.agreement import finite_pairs, row_cosines
from edgeopt.device.runtime import one_input_alias
from edgeopt.device.task_metric import MetricCheck, MetricSpec, MetricValues, call_metric
from edgeopt.errors import BadInputError, first_line

SCHEMA = "edgeopt-golden/1"
MANIFEST = "golden.json"
ARRAYS = "golden.npz"
TARGETS = "targets.json"
METRIC_FILE = "metric.py"
FILES = (MANIFEST, ARRAYS, TARGETS, METRIC_FILE)  # every file a golden set may hold
WORST = 3  # samples named when a check fails


@dataclass(frozen=True)
class Tolerance:
    """How far one output may move from the reference: mean cosine at least ``min_cosine``, and (when set)
    no element further than ``max_abs_error``."""

    min_cosine: float = 0.99
    max_abs_error: float | None = None

    def describe(self) -> dict:
        return {"min_cosine": self.min_cosine, "max_abs_error": self.max_abs_error}


@dataclass
class GoldenSet:
    """A loaded golden set: per-sample input feeds, reference outputs by name, targets, the metric's record."""

    root: Path
    manifest: dict
    feeds: list[dict[str, np.ndarray]]
    outputs: dict[str, np.ndarray]  # name -> samples x the output's shape
    targets: list | None

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.manifest["outputs"]]

    def tolerance(self, name: str) -> Tolerance:
        entry = next(o for o in self.manifest["outputs"] if o["name"] == name)
        return Tolerance(**entry["tolerance"])

    @property
    def metric(self) -> dict | None:
        return self.manifest.get("metric")

    @property
    def metric_spec(self) -> MetricSpec | None:
        return MetricSpec.from_dict(self.metric) if self.metric else None

    @property
    def metric_file(self) -> Path | None:
        """The shipped metric file, when the set has one."""
        shipped = (self.metric or {}).get("file")
        return self.root / shipped if shipped else None


@dataclass(frozen=True)
class OutputCheck:
    name: str
    cosine: float  # mean over samples
    worst_cosine: float
    max_abs_error: float
    tolerance: Tolerance
    passed: bool

    def describe(self) -> dict:
        return {"name": self.name, "cosine": self.cosine, "worst_cosine": self.worst_cosine,
                "max_abs_error": self.max_abs_error, "tolerance": self.tolerance.describe(), "passed": self.passed}


@dataclass(frozen=True)
class GoldenResult:
    """An artifact against a golden set: per output, the metric (when evaluated), the worst samples."""

    golden: str
    samples: int
    outputs: list[OutputCheck]
    worst: list[dict]  # {"index", "outputs": {name: {"cosine", "max_abs_error"}}}, worst first
    metric: MetricCheck | None = None
    metric_values: MetricValues | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs) and (self.metric is None or self.metric.passed)

    def describe(self) -> dict:
        return {"golden": self.golden, "samples": self.samples, "passed": self.passed,
                "outputs": [o.describe() for o in self.outputs],
                "metric": self.metric.describe() if self.metric else None,
                "metric_values": self.metric_values.describe() if self.metric_values else None,
                "worst_samples": self.worst, "notes": list(self.notes)}

    def message(self) -> str:
        return golden_message(self.describe())


def golden_message(result: dict) -> str:
    """One line from ``GoldenResult.describe()``: what failed and the worst samples."""
    failed = []
    for output in result["outputs"]:
        if not output["passed"]:
            tolerance = output["tolerance"]
            bound = f"cosine {output['cosine']:.5f} (min {tolerance['min_cosine']})"
            if _broken(output["max_abs_error"]):
                bound = f"inf or NaN where the golden output is finite, {bound}"
            elif tolerance["max_abs_error"] is not None:
                bound += f", max abs error {output['max_abs_error']:.4g} (max {tolerance['max_abs_error']})"
            failed.append(f"output '{output['name']}' {bound}")
    metric = result.get("metric")
    if metric is not None and not metric["passed"]:
        failed.append(f"{metric['primary']} {metric['value']:.6g} vs {metric['reference']:.6g} (drop "
                      f"{metric['drop']:.4g}, max {metric['threshold']:.4g}; metric {metric['name']})")
    worst = "; ".join(f"#{w['index']} (" + ", ".join(f"{name}: cosine {e['cosine']:.4f}, max abs {_abs(e)}"
                                                    for name, e in w["outputs"].items()) + ")"
                      for w in result["worst_samples"])
    return f"golden set {result['golden']}: {'; '.join(failed) or 'passed'}; worst samples: {worst}"


def _abs(errors: dict) -> str:
    return "inf/NaN" if _broken(errors["max_abs_error"]) else f"{errors['max_abs_error']:.4g}"


def _broken(max_abs_error: float | None) -> bool:
    """An error from an output inf or NaN where the golden one is finite (:func:`_errors`; null once in JSON)."""
    return max_abs_error is None or not np.isfinite(max_abs_error)


def load_golden(folder: str | Path) -> GoldenSet:
    """Read and check a golden set folder; anything missing or malformed is a ``BadInputError``."""
    root = Path(folder)
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"{root}: not a golden set (no readable {MANIFEST}: {first_line(exc)})") from exc
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise BadInputError(f"{path}: not a golden set of schema {SCHEMA}")
    try:
        with np.load(root / ARRAYS, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
        inputs = [spec["name"] for spec in manifest["inputs"]]
        outputs = {o["name"]: arrays[f"output:{o['name']}"] for o in manifest["outputs"]}
        count = manifest["samples"]
        feeds = [{name: arrays[f"input:{name}"][i] for name in inputs} for i in range(count)]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise BadInputError(f"{root / ARRAYS}: does not hold the arrays {MANIFEST} lists ({first_line(exc)})") from exc
    targets = None
    if manifest.get("targets"):
        try:
            targets = decode(json.loads((root / manifest["targets"]).read_text(encoding="utf-8"))["targets"])
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise BadInputError(f"{root / TARGETS}: unreadable targets ({first_line(exc)})") from exc
    return GoldenSet(root, manifest, feeds, outputs, targets)


def compare(golden: GoldenSet, predict, metric_function=None, spec: MetricSpec | None = None) -> GoldenResult:
    """Run ``predict(feeds) -> list[array]`` (outputs in the golden set's order) on every golden input and
    compare with the reference outputs; ``metric_function``: the golden metric, evaluated on the outputs and
    the stored targets and judged against the stored reference value (``None``: not evaluated, noted);
    ``spec``: its declaration and allowed drop (default: as stored in the set)."""
    names = golden.output_names
    produced = [[np.asarray(o) for o in predict(feeds)] for feeds in golden.feeds]
    if produced and len(produced[0]) != len(names):
        raise BadInputError(f"the model has {len(produced[0])} outputs, the golden set {golden.root} "
                            f"{len(names)} ({', '.join(names)})")
    per_sample = []  # per sample: name -> (cosine, max abs error)
    for index, outs in enumerate(produced):
        per_sample.append({name: _errors(out, golden.outputs[name][index]) for name, out in zip(names, outs)})
    checks = []
    for name in names:
        cosines = np.array([s[name][0] for s in per_sample])
        worst_abs = max(s[name][1] for s in per_sample)
        tolerance = golden.tolerance(name)
        ok = cosines.mean() >= tolerance.min_cosine and np.isfinite(worst_abs) and (  # inf: an output inf or NaN
            tolerance.max_abs_error is None or worst_abs <= tolerance.max_abs_error)  # where the reference is finite
        checks.append(OutputCheck(name, float(cosines.mean()), float(cosines.min()), float(worst_abs), tolerance,
                                  bool(ok)))
    order = sorted(range(len(per_sample)), key=lambda i: min(c for c, _ in per_sample[i].values()))
    worst = [{"index": i, "outputs": {n: {"cosine": c, "max_abs_error": e} for n, (c, e) in per_sample[i].items()}}
             for i in order[:WORST]]
    check, values, notes = None, None, []
    spec = spec or golden.metric_spec
    if spec is not None and golden.metric is None:
        notes.append(f"metric {spec.name} not evaluated: the golden set holds no reference value of a metric")
    elif spec is not None and metric_function is None:
        notes.append(f"metric {spec.name} not evaluated here (its file is not available); per-output tolerances "
                     f"only")
    elif spec is not None:
        outputs = [dict(zip(names, outs)) for outs in produced]
        values = call_metric(spec, metric_function, outputs, golden.targets)
        check = spec.judge(MetricValues.from_dict(golden.metric["reference"]), values)
    return GoldenResult(str(golden.root), len(produced), checks, worst, check, values, notes)


def session_predict(session, golden: GoldenSet):
    """A runtime session's ``infer`` with its outputs in the golden set's order: by name where the model names
    them alike, else by position."""
    names, wanted = [spec.name for spec in session.outputs], golden.output_names
    inputs = [spec.name for spec in session.inputs]

    def infer(feeds: dict) -> list:
        feeds = one_input_alias(inputs, feeds)  # a set made when a factory's single input was named "input"
        if set(feeds) != set(inputs):
            raise BadInputError(f"golden set {golden.root}: its inputs are {', '.join(sorted(feeds))}, the "
                                f"model's {', '.join(inputs)}")
        return session.infer(feeds)

    if not set(wanted) <= set(names):
        return infer
    order = [names.index(n) for n in wanted]
    return lambda feeds: [outs[i] for outs in [infer(feeds)] for i in order]


def _errors(output: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    a = output.astype(np.float64).reshape(-1)
    b = reference.astype(np.float64).reshape(-1)
    if a.shape != b.shape:
        raise BadInputError(f"an output has {a.size} values, the golden set's {b.size}")
    a, b, broken, _ = finite_pairs(a[None], b[None])  # as the host's gate: the reference's own inf left out
    if broken[0]:  # inf or NaN where the reference is finite: never within a tolerance (reported as null)
        return 0.0, float("inf")
    return float(row_cosines(a, b)[0]), float(np.abs(a - b).max()) if a.size else 0.0


def load_metric_file(golden: GoldenSet):
    """The metric function from the set's shipped file (imported from the bundle: run only when asked)."""
    from edgeopt.device.pyfile import import_file

    path = golden.metric_file
    if path is None or not path.is_file():
        return None
    name = golden.metric["function"]
    try:
        module = import_file(path, "edgeopt_golden_metric")
    except Exception as exc:
        raise BadInputError(f"metric {path}:{name}: cannot import ({first_line(exc)})") from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise BadInputError(f"metric {path}: has no function '{name}'")
    return function


def encode(value):
    """Targets as JSON: arrays keep their dtype and shape; tuples become lists; numbers and strings stay."""
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        array = np.asarray(value)
        if array.dtype.kind not in "biufU":
            raise BadInputError(f"a target of dtype {array.dtype} cannot be stored in a golden set")
        return {"__array__": array.tolist(), "dtype": str(array.dtype), "shape": list(array.shape)}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise BadInputError("a target dict must have string keys to be stored in a golden set")
        return {"__dict__": {k: encode(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise BadInputError(f"a target of type {type(value).__name__} cannot be stored in a golden set")


def decode(value):
    if isinstance(value, dict) and "__array__" in value:
        return np.asarray(value["__array__"], dtype=value["dtype"]).reshape(value["shape"])
    if isinstance(value, dict) and "__dict__" in value:
        return {k: decode(v) for k, v in value["__dict__"].items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value

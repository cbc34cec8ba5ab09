"""The source's dynamic input dimensions, opened again in the ONNX artifact and the OpenVINO IR.

The source is an ONNX file, or a PyTorch model that declares dynamic dimensions (a Hugging Face folder's batch
and length), whose FP32 ONNX export with those dimensions dynamic stands for it here.

edgeopt converts and calibrates at fixed sizes (``--input-shape``, a dynamic batch at 1), and its graph passes
may fold what those sizes make constant. A runtime runs a file only at the sizes it declares, so an artifact
left at the fixed sizes would take away what the user's file could do (an OCR recogniser's text-line width, a
detector's image size, the batch). :func:`reopen` declares the source's dynamic dimensions again where the
artifact still computes the source's result at other sizes: it runs both at twice the calibrated size on each
such dimension (a few calibration samples, each joined along the batch with the next one and along any other
dimension with its own mirror image, so that a window or a scale fixed in the graph shows); where that fails,
on the dimensions at which the source itself runs grown one at a time (a dimension named alike on several
inputs grows on all), then on the batch alone, and keeps the first that holds. The calibrated sizes are
recorded in the file's metadata (``RECORDED_SHAPES``; the IR's runtime information), where a validator takes
them for a dimension it is given no size for. The check runs the ONNX artifact in ONNX Runtime and the IR in
OpenVINO (FP32 on the CPU), each against the source run in ONNX Runtime.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from edgeopt import jsonio
from edgeopt.device.runtime import RECORDED_SHAPES, TensorSpec, format_sizes
from edgeopt.source import dynamic_dims, fixed_dim

PROBE_FACTOR = 2  # each opened dimension is checked at this multiple of its calibrated size
SAMPLES = 3  # calibration samples the check runs
LINE = 200  # characters of a runtime's error kept in the reason
TOLERANCE = 0.02  # the worst output's cosine at the probe sizes may sit this far below the calibrated sizes'
SCALE_TOLERANCE = 0.05  # and its norm may stray this much further from the source's (cosine ignores scale)


@dataclass(frozen=True)
class Reopened:
    """Which dynamic dimensions an artifact declares again, and the check that allowed it."""

    artifact: str  # "ONNX artifact", "OpenVINO IR"
    opened: list[str]  # "x[0]", ...: dynamic in the artifact as in the source
    fixed: list[str]  # "x[3] = 320", ...: the source's dynamic dimensions the artifact keeps fixed
    probe_shapes: list[dict[str, list[int]]]  # the sizes the opened artifact was checked at (2x, then 1 shorter)
    cosine: float | None  # its worst output's cosine to the source's there (worst over the samples)
    calibrated_cosine: float | None  # and at the calibrated sizes
    samples: int  # calibration samples the check ran
    reason: str  # why the fixed ones stay fixed ("" when none does)
    axes: dict[str, list[int]] = field(default_factory=dict)  # ``opened`` by input name: the axes declared dynamic

    def describe(self) -> dict:
        return {"opened": list(self.opened), "fixed": list(self.fixed),
                "probe_shapes": [dict(shapes) for shapes in self.probe_shapes], "cosine": self.cosine,
                "calibrated_cosine": self.calibrated_cosine, "samples": self.samples, "reason": self.reason}

    def note(self) -> str:
        parts = []
        if self.opened:
            parts.append(f"dynamic input dimensions kept dynamic in the {self.artifact}: {', '.join(self.opened)} "
                         f"(checked at {' and at '.join(format_sizes(shapes) for shapes in self.probe_shapes)}: worst "
                         f"output's cosine to the source {self.cosine:.4f}, {self.calibrated_cosine:.4f} at the "
                         f"calibrated sizes, on "
                         f"{self.samples} calibration sample(s); a check that the graph holds no calibrated size, "
                         f"not the quality gate, which judged the calibrated sizes)")
        if self.fixed:
            parts.append(("" if self.opened else "dynamic input dimensions ")
                         + f"fixed in the {self.artifact}, which runs at these sizes only: {', '.join(self.fixed)} "
                         f"({self.reason})")
        return "; ".join(parts)


def reopen(artifact, source, declared: list[TensorSpec], samples: list[dict[str, np.ndarray]],
           source_feeds: dict[str, np.ndarray] | None = None,
           run_source: Callable[[dict[str, np.ndarray]], list[np.ndarray]] | None = None):
    """``artifact`` (an ``onnx.ModelProto`` or ``openvino.Model`` at the calibrated sizes) with the dynamic
    dimensions of ``declared`` (the source's inputs) declared again where it still matches ``source`` (the ONNX
    file's path, or a ``ModelProto``: a PyTorch model's FP32 export) on the first ``SAMPLES`` of ``samples``
    grown along them; returns ``(model, Reopened)``, or ``(artifact, None)`` when the source declares no dynamic
    dimension. ``source_feeds``: inputs the source has and the artifact does not (pinned rank-0 values).
    ``run_source``: the source's outputs for given inputs, in place of ``source`` run in ONNX Runtime (a PyTorch
    model run itself: its export may hold a size the trace saw, and would agree with the artifact on it)."""
    import onnx

    kind = _ONNX if isinstance(artifact, onnx.ModelProto) else _OPENVINO
    samples = samples[:SAMPLES]
    sample = samples[0]  # the sizes, and the structural probes of the source
    dynamic = dynamic_dims(declared, set(kind.input_names(artifact)) & set(sample))
    if not dynamic:
        return artifact, None
    if isinstance(source, onnx.ModelProto):
        source_model, what = source, "the source's FP32 export"
    else:
        source_model, what = onnx.load(str(source), load_external_data=False), "the source file"
    batch = {spec.name: [spec.batch_dim] for spec in declared if spec.batch_dim in dynamic.get(spec.name, [])}
    extra = source_feeds or {}
    runner = "ONNX Runtime" if run_source is None else "the source model"
    try:  # (a model over 2 GB cannot be serialised: protobuf's limit)
        if run_source is None:
            session = _session(source.SerializeToString() if isinstance(source, onnx.ModelProto) else str(source))
            run_source = partial(_run, session)
        calibrated = [run_source({**s, **extra}) for s in samples]
    except Exception as exc:  # the file as it is, unpinned and at dimensions declared 0: not every one runs
        return artifact, Reopened(kind.label, [], _fixed(dynamic, {}, sample), [], None, None, len(samples),
                                  f"{runner} does not run {what} as it is ({_line(exc)})"
                                  if runner == "ONNX Runtime" else f"{runner} does not run as given ({_line(exc)})")
    failures = []

    def source_runs(axes: dict[str, list[int]]) -> bool:
        probe = _probe(samples, 0, axes, batch)
        try:
            run_source({**probe, **extra})
            return True
        except Exception as exc:
            failures.append(f"the source does not run at {format_sizes(_shapes(probe, axes))} ({_line(exc)})")
            return False

    for axes in _attempts(dynamic, batch, _groups(source_model, dynamic), source_runs):
        probes = []  # (sizes, the grown samples, the source's outputs there)
        for shrink in (False, True):
            grown = [_probe(samples, index, axes, batch, shrink) for index in range(len(samples))]
            if grown[0] is None:
                continue
            shapes = _shapes(grown[0], axes)
            try:
                probes.append((shapes, grown, [run_source({**probe, **extra}) for probe in grown]))
            except Exception as exc:  # twice the size must run; one shorter only where the source takes it
                if not shrink:
                    failures.append(f"the source does not run at {format_sizes(shapes)} ({_line(exc)})")
                    break
        if not probes:
            continue
        try:  # OpenVINO refuses a reshape its graph cannot take
            model = kind.declare(artifact, source_model, axes, sample)
            run = kind.runner(model)
            at_calibrated = _agreement([run(s) for s in samples], calibrated)
        except Exception as exc:
            failures.append(f"the artifact does not run at {format_sizes(probes[0][0])} ({_line(exc)})")
            continue
        worst, failure = None, ""
        for shapes, grown, expected in probes:
            at_probe, failure = _compare(run, shapes, grown, expected, at_calibrated)
            if failure:
                break
            worst = at_probe if worst is None or at_probe.cosine < worst.cosine else worst
        if failure:
            failures.append(failure)
            continue
        fixed = _fixed(dynamic, axes, sample)
        return model, Reopened(kind.label, _names(axes), fixed, [sizes for sizes, _, _ in probes],
                               round(worst.cosine, 6), round(at_calibrated.cosine, 6), len(samples),
                               "; ".join(dict.fromkeys(failures)) if fixed else "", axes)
    return artifact, Reopened(kind.label, [], _fixed(dynamic, {}, sample), [], None, None, len(samples),
                              "; ".join(dict.fromkeys(failures)))


def _compare(run, shapes: dict[str, list[int]], grown: list[dict[str, np.ndarray]],
             expected: list[list[np.ndarray]], at_calibrated: "_Agreement") -> tuple["_Agreement | None", str]:
    """How close the artifact (``run``) comes to the source's ``expected`` outputs at the probe ``grown`` (sizes
    ``shapes``), and why that is not as close as at the calibrated sizes ("" where it is)."""
    try:
        got = [run(probe) for probe in grown]
    except Exception as exc:
        return None, f"the artifact does not run at {format_sizes(shapes)} ({_line(exc)})"
    if [g.shape for g in got[0]] != [e.shape for e in expected[0]]:
        return None, (f"at {format_sizes(shapes)} the artifact's output shapes {[list(g.shape) for g in got[0]]} "
                      f"differ from the source's {[list(e.shape) for e in expected[0]]}")
    at_probe = _agreement(got, expected)
    if at_probe.cosine < at_calibrated.cosine - TOLERANCE:
        return at_probe, (f"at {format_sizes(shapes)} its worst output's cosine to the source is "
                          f"{at_probe.cosine:.4f}, {at_calibrated.cosine:.4f} at the calibrated sizes")
    if at_probe.scale_error > at_calibrated.scale_error + SCALE_TOLERANCE:
        return at_probe, (f"at {format_sizes(shapes)} an output's norm is {at_probe.scale_error:.1%} off the source's, "
                          f"{at_calibrated.scale_error:.1%} at the calibrated sizes")
    return at_probe, ""


def _attempts(dynamic: dict[str, list[int]], batch: dict[str, list[int]], groups: list[dict[str, list[int]]],
              source_runs):
    """The axes to try opening, widest first: every dynamic one; the groups at which the source runs when grown
    alone (``source_runs``), together; the batch axes. Lazily: each is worked out only if the one before failed."""
    seen = []
    for axes in (lambda: dynamic, lambda: _union([g for g in groups if source_runs(g)]), lambda: batch):
        wanted = axes()
        if wanted and wanted not in seen:
            seen.append(wanted)
            yield wanted


def _groups(source, dynamic: dict[str, list[int]]) -> list[dict[str, list[int]]]:
    """The dynamic axes in groups that must grow together: those the source names alike (a batch on two inputs);
    an unnamed dimension is a group of its own."""
    named = {value.name: value.type.tensor_type.shape.dim for value in source.graph.input}
    groups: dict = {}
    for name, axes in dynamic.items():
        for axis in axes:
            key = named[name][axis].dim_param or (name, axis)
            groups.setdefault(key, {}).setdefault(name, []).append(axis)
    return list(groups.values())


def _union(groups: list[dict[str, list[int]]]) -> dict[str, list[int]]:
    merged: dict[str, set[int]] = {}
    for group in groups:
        for name, axes in group.items():
            merged.setdefault(name, set()).update(axes)
    return {name: sorted(axes) for name, axes in merged.items()}


def _probe(samples: list[dict[str, np.ndarray]], index: int, axes: dict[str, list[int]],
           batch: dict[str, list[int]], shrink: bool = False) -> dict[str, np.ndarray] | None:
    """Sample ``index`` grown ``PROBE_FACTOR`` times on ``axes``: along a batch axis joined with the next
    samples, along any other with its mirror image (different content, so a window or a count fixed in the graph
    changes the result). ``shrink``: along the other axes one shorter than calibrated instead (a size no multiple
    of the calibrated one shows a padding to a multiple folded in); None when no such axis is longer than 2."""
    if shrink and not any(value.shape[axis] > 2 for name, value in samples[index].items()
                          for axis in axes.get(name, []) if axis not in batch.get(name, [])):
        return None
    grown = {}
    for name, value in samples[index].items():
        for axis in axes.get(name, []):
            if axis in batch.get(name, []):
                parts = [samples[(index + k) % len(samples)][name] for k in range(PROBE_FACTOR)]
            elif shrink:
                parts = [np.take(value, range(max(1, value.shape[axis] - 1)), axis=axis)]
            else:
                parts = [value if k % 2 == 0 else np.flip(value, axis) for k in range(PROBE_FACTOR)]
            value = np.concatenate(parts, axis=axis)
        grown[name] = value
    return grown


def _shapes(probe: dict[str, np.ndarray], axes: dict[str, list[int]]) -> dict[str, list[int]]:
    """The sizes of the grown inputs of ``probe``."""
    return {name: list(value.shape) for name, value in probe.items() if name in axes}


def _declared_onnx(artifact, source, axes: dict[str, list[int]], sample: dict[str, np.ndarray]):
    """A copy of ``artifact`` whose inputs take the source's dimensions on ``axes``, whose outputs take the
    source's declared shapes where the artifact's have their rank (none where they do not, or the artifact
    declares none: a shape the graph does not compute, dropped by ``edgeopt.onnx_prep.outputs_as_computed``), with
    no inferred intermediate shapes, and the calibrated sizes in its metadata."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(artifact)
    declared = {value.name: value for value in source.graph.input}
    for value in model.graph.input:
        for axis in axes.get(value.name, []):
            dim = value.type.tensor_type.shape.dim[axis]
            dim.CopyFrom(declared[value.name].type.tensor_type.shape.dim[axis])
            if not dim.dim_param:  # declared as 0 or not at all: unknown
                dim.Clear()
    outputs = {value.name: value for value in source.graph.output}
    for value in model.graph.output:
        declared_output = outputs.get(value.name)
        tensor = value.type.tensor_type
        if (declared_output is not None and declared_output.type.tensor_type.HasField("shape")
                and tensor.HasField("shape")
                and len(declared_output.type.tensor_type.shape.dim) == len(tensor.shape.dim)):
            for own, declared in zip(tensor.shape.dim, declared_output.type.tensor_type.shape.dim):
                if declared.dim_param or not own.dim_value or declared.dim_value == own.dim_value:
                    own.CopyFrom(declared)  # the source's name for a size, or its size where they agree
        else:
            value.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    recorded = [prop for prop in model.metadata_props if prop.key == RECORDED_SHAPES]
    for prop in recorded:
        model.metadata_props.remove(prop)
    model.metadata_props.add(key=RECORDED_SHAPES, value=_recorded(axes, sample))
    return model


def _declared_openvino(artifact, source, axes: dict[str, list[int]], sample: dict[str, np.ndarray]):
    """A copy of ``artifact`` whose inputs are dynamic on ``axes``, with the calibrated sizes in its runtime
    information where an ONNX file's metadata sits (``device.runtime.OpenVINOSession`` reads them there)."""
    import openvino as ov

    model = artifact.clone()
    model.reshape({port: ov.PartialShape([-1 if axis in axes[port.get_any_name()] else size
                                          for axis, size in enumerate(port.get_shape())])
                   for port in model.inputs if port.get_any_name() in axes})
    model.set_rt_info(_recorded(axes, sample), ["framework", RECORDED_SHAPES])
    return model


def _recorded(axes: dict[str, list[int]], sample: dict[str, np.ndarray]) -> str:
    return jsonio.dumps({name: list(sample[name].shape) for name in axes}, sort_keys=True)


def onnx_runner(model) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """The ONNX model in ONNX Runtime on 2 threads, fed the inputs it has."""
    session = _session(model.SerializeToString())
    return lambda feeds: _run(session, feeds)


def openvino_runner(model) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """The model compiled for the CPU in FP32 on 2 threads, fed the inputs it has: the checks compare graphs, not
    precisions."""
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2})
    wanted = {port.get_any_name() for port in model.inputs}
    return lambda feeds: [np.asarray(value) for value in compiled(
        {name: value for name, value in feeds.items() if name in wanted}).values()]


@dataclass(frozen=True)
class _Kind:
    """What the check needs of one artifact format."""

    label: str
    input_names: Callable[[Any], list[str]]
    declare: Callable[..., Any]  # (artifact, source ONNX model, axes, calibrated sample) -> a declared copy
    runner: Callable[[Any], Callable[[dict[str, np.ndarray]], list[np.ndarray]]]


_ONNX = _Kind("ONNX artifact", lambda model: [value.name for value in model.graph.input], _declared_onnx,
              onnx_runner)
_OPENVINO = _Kind("OpenVINO IR", lambda model: [port.get_any_name() for port in model.inputs], _declared_openvino,
                  openvino_runner)


def _session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # a size the model cannot take is an expected answer here, not an error to log
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _run(session, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    wanted = {spec.name for spec in session.get_inputs()}
    return session.run(None, {name: value for name, value in feeds.items() if name in wanted})


@dataclass(frozen=True)
class _Agreement:
    cosine: float  # the worst output's cosine to the source's
    scale_error: float  # the largest |norm / the source's norm - 1| of an output


def _agreement(runs: list[list[np.ndarray]], references: list[list[np.ndarray]]) -> _Agreement:
    """How close each run's outputs are to the source's, worst over outputs and runs."""
    from edgeopt.evaluate import sample_cosines

    pairs = [(np.asarray(o, np.float64).ravel(), np.asarray(r, np.float64).ravel())
             for run, reference in zip(runs, references) for o, r in zip(run, reference)]
    cosine = min(float(sample_cosines(o[None], r[None])[0]) for o, r in pairs)
    norms = [(np.linalg.norm(o), np.linalg.norm(r)) for o, r in pairs]
    scale = max(abs(a / b - 1) if b else (0.0 if a == 0 else np.inf) for a, b in norms)
    return _Agreement(cosine, float(scale))


def _names(axes: dict[str, list[int]]) -> list[str]:
    return [f"{name}[{axis}]" for name, opened in axes.items() for axis in opened]


def _fixed(dynamic: dict[str, list[int]], opened: dict[str, list[int]], sample: dict[str, np.ndarray]) -> list[str]:
    return [fixed_dim(name, axis, sample[name].shape[axis]) for name, axes in dynamic.items() for axis in axes
            if axis not in opened.get(name, [])]


def _line(exc: BaseException) -> str:
    """The runtime's error in a line: of ONNX Runtime's, the node and the cause, without the boilerplate."""
    from edgeopt.errors import first_line

    text = first_line(exc, 1000)
    failed = re.search(r"running (\S+) node\. Name:'([^']*)' Status Message: (?:\S+:\d+ \S+ )?(.*)", text)
    if failed:
        text = f"{failed.group(1)} node '{failed.group(2)}': {failed.group(3)}"
    return text if len(text) <= LINE else text[:LINE - 1] + "…"

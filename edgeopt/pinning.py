"""Rank-0 inputs that choose a branch, pinned to the one value the user's data gives them.

Silero VAD takes its sample rate as a rank-0 int64 input and picks its 16 kHz or 8 kHz network with an ``If``
on it (and, in the shipped ``silero_vad.onnx``, a dozen nested ``If``s on shapes). Neither toolchain handles
that: OpenVINO cannot convert the nested ``If``s with dynamic ranks, and NNCF 3.4's OpenVINO graph builder
fails inside an ``If`` body whose constants OpenVINO's ONNX frontend shares with the other branch ("Could not
find a node ... in NNCFGraph": it follows a shared Constant's consumers into the other body). When every
calibration, evaluation and training sample gives a rank-0 input of an ONNX model with ``If``s the same value,
the branches that value does not take never run on the user's data: the input becomes that constant and the
``If``s it decides are folded (:func:`edgeopt.onnx_prep.pin_inputs`). The folded model is checked against the
original on the calibration samples before it is used. The artifacts then have no such input and compute what
the original computes for that value; ``decisions.pinned_inputs`` in the report and a note say so. Data with
more than one value (samples for every branch) leaves the model as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.onnx_prep import count_ops, pin_inputs

CHECK_SAMPLES = 16  # calibration samples the folded model is compared with the original on
RTOL, ATOL = 1e-4, 1e-5  # constant folding reorders nothing numerically; this only absorbs float noise


@dataclass(frozen=True)
class Pinned:
    """What pinning did: the inputs and values, the ``If``s before and after, and the check against the
    original."""

    values: dict[str, float | int]
    ifs_before: int
    ifs_after: int
    checked_samples: int
    max_abs_diff: float
    path: Path  # the folded ONNX model (in a folder the caller owns)

    def describe(self) -> dict:
        return {"values": dict(self.values), "if_ops_before": self.ifs_before, "if_ops_after": self.ifs_after,
                "checked_samples": self.checked_samples, "max_abs_diff": self.max_abs_diff,
                "why": "every sample gives these rank-0 inputs one value; the branches it does not take were "
                       "folded away"}

    def note(self) -> str:
        pins = ", ".join(f"{name}={value}" for name, value in self.values.items())
        return (f"pinned {pins}: every sample gives it this one value, so the {self.ifs_before - self.ifs_after} "
                f"If op(s) it decides were folded to the branch it takes (same outputs as the original on "
                f"{self.checked_samples} calibration samples, max |diff| {self.max_abs_diff:.2g}); the artifacts "
                f"have no input {', '.join(self.values)} and compute the original's result for {pins} only")

    def apply(self, source, *sets: SampleSet | None):
        """``source`` as the folded model without the pinned inputs, and each sample set without them."""
        pinned = replace(source, path=self.path, onnx_path=self.path,
                         inputs=[spec for spec in source.inputs if spec.name not in self.values])
        return (pinned, *(None if s is None else replace(s, samples=[
            {name: value for name, value in sample.items() if name not in self.values} for sample in s.samples])
            for s in sets))


def pin_branch_inputs(source, sets: list[SampleSet], folder: Path) -> Pinned | None:
    """Pin the rank-0 inputs of an ONNX ``source`` with ``If`` ops that every sample of ``sets`` gives one value,
    when that folds at least one ``If`` and the folded model matches the original; the folded model is written
    to ``folder``. None when there is nothing to pin."""
    import onnx

    if source.kind != "onnx" or not any(spec.shape == () for spec in source.inputs):
        return None  # nothing to pin: spare every other ONNX model a second full load
    model = onnx.load(str(source.path))
    before = count_ops(model, "If")
    values = {spec.name: np.asarray(value, spec.dtype) for spec in source.inputs if spec.shape == ()
              for value in (_single_value(spec.name, sets),) if value is not None} if before else {}
    if not values:
        return None
    shapes = {spec.name: list(spec.shape) for spec in source.inputs if spec.name not in values}
    folded = pin_inputs(model, values, shapes)
    if folded is None or count_ops(folded, "If") >= before:
        return None
    path = folder / "pinned.onnx"
    onnx.save(folded, str(path))
    samples = sets[0].samples[:CHECK_SAMPLES]
    diff = _max_abs_diff(source.path, path, samples, set(values))
    if diff is None:
        return None
    return Pinned({name: value.item() for name, value in values.items()}, before, count_ops(folded, "If"),
                  len(samples), diff, path)


def _single_value(name: str, sets: list[SampleSet]) -> np.ndarray | None:
    seen = [np.asarray(sample[name]) for s in sets for sample in s.samples if name in sample]
    if not seen or any(not np.array_equal(value, seen[0]) for value in seen[1:]):
        return None
    return seen[0]


def _max_abs_diff(original: Path, folded: Path, samples: list[dict], pinned: set[str]) -> float | None:
    """Largest absolute difference between the two models' outputs on ``samples`` (ONNX Runtime), or None when
    they differ beyond float noise or one cannot run."""
    from edgeopt.device.runtime import RuntimeSettings, open_session

    settings = RuntimeSettings(runtime="onnxruntime", threads=1, inference_precision=None, performance_hint=None)
    try:
        want_session, got_session = open_session(original, settings), open_session(folded, settings)
        largest = 0.0
        for sample in samples:
            want = want_session.infer(sample)
            got = got_session.infer({k: v for k, v in sample.items() if k not in pinned})
            if len(got) != len(want) or any(np.shape(g) != np.shape(w) or not np.allclose(g, w, RTOL, ATOL)
                                            for g, w in zip(got, want)):
                return None
            largest = max([largest] + [float(np.max(np.abs(np.asarray(g, np.float64) - w), initial=0.0))
                                       for g, w in zip(got, want)])
    except Exception:  # the original or the folded model does not run on these samples: leave the model alone
        return None
    return largest

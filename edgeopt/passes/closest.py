"""Quantize a model a few ways and keep the one whose worst output is closest to the FP32 model's on a few
calibration samples (the gate's measure): how the ``int8`` step decides where no static rule can. Its users:
SmoothQuant for transformers (``edgeopt.passes.smooth_quant``), the preset of a CNN whose activations have a
negative tail (``edgeopt.presets``) and the float scope of a recurrent model (``edgeopt.recurrent``)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Closest(Generic[T]):
    model: object  # the openvino.Model kept
    choice: T  # what it was quantized with
    label: str  # the choice, in words
    cosines: dict[str, float]  # every candidate's worst-output cosine, by label
    samples: int  # how many calibration samples they were measured on

    @property
    def figures(self) -> str:
        return ", ".join(f"{label}: {cosine:.4f}" for label, cosine in self.cosines.items())


def quantize_closest(ov_model, samples: list[dict], candidates: dict[str, T], quantize: Callable[[object, T], object],
                     *, tolerance: float = 0.0, read_back: bool = False) -> Closest[T]:
    """``quantize(copy of ov_model, choice)`` for each of ``candidates`` (label -> choice), each compared with
    ``ov_model`` on ``samples`` by its worst output's cosine. The first candidate is the default: another is kept
    only when it is higher by more than ``tolerance``. ``read_back``: measure each model as written to an IR and
    read again (a recurrent cell reads worse from the file than from memory)."""
    import openvino as ov

    from edgeopt.data import SampleSet
    from edgeopt.evaluate import all_outputs, compare_outputs
    from edgeopt.judge import compiled_predictor

    def outputs(model):
        return all_outputs(compiled_predictor(model), SampleSet(samples, None, "calibration"), []).values

    reference = outputs(ov_model)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, (label, choice) in enumerate(candidates.items()):
            quantized = quantize(ov_model.clone(), choice)
            measured = quantized
            if read_back:
                path = Path(tmp) / f"candidate{index}.xml"
                ov.save_model(quantized, str(path))
                measured = ov.Core().read_model(str(path))
            worst = min(compare_outputs(o, r).cosine for o, r in zip(outputs(measured), reference))
            results.append((worst, label, choice, quantized))
    best = results[0]
    for result in results[1:]:
        if result[0] > best[0] + tolerance:
            best = result
    return Closest(best[3], best[2], best[1], {label: worst for worst, label, _, _ in results}, len(samples))

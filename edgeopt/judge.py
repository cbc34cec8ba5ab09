"""The quality gate applied to an in-memory OpenVINO model: the path ``pipeline._evaluate`` takes for an artifact
(every output on the evaluation set, f32 pinned, ``measure_outputs`` then ``QualityGate.check``), for passes that
must judge candidates before anything is saved (the repair ladder, the sensitivity analysis).

The reference is the FP32 graph the pass received, run the same way; the pipeline's final gate then measures
the saved artifact against the original in its own framework.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.evaluate import (Outputs, Quality, QualityGate, all_outputs, language_model_ids, measure_outputs,
                              sample_cosines)


def compile_f32(ov_model):
    """An in-memory OpenVINO model compiled for the CPU with f32 pinned (as the gate runs artifacts)."""
    import openvino as ov

    return ov.Core().compile_model(ov_model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def compiled_predictor(ov_model):
    """``predict(feeds) -> [output arrays]`` for an in-memory OpenVINO model, f32 pinned (as the gate runs)."""
    return predictor(compile_f32(ov_model))


def predictor(compiled):
    """``predict(feeds) -> [output arrays]`` of a compiled OpenVINO model, in the model's output order."""
    request = compiled.create_infer_request()

    def predict(feeds: dict) -> list[np.ndarray]:
        result = request.infer(feeds)
        return [np.array(result[port]) for port in compiled.outputs]

    return predict


@dataclass
class Verdict:
    quality: Quality
    passed: bool
    check: str
    outputs: Outputs


class Judge:
    """Judges candidates of one model on one sample set through the quality gate."""

    def __init__(self, fp32_model, samples: SampleSet, gate: QualityGate, output_names: list[str]):
        self.samples, self.gate = samples, gate
        original = compiled_predictor(fp32_model)
        self.reference_outputs = all_outputs(original, samples, output_names)
        self.token_ids = language_model_ids(original, samples)
        self.reference = measure_outputs("original", self.reference_outputs, samples.labels, None,
                                         gated=gate.outputs, metric=gate.metric, targets=samples.targets)

    def __call__(self, ov_model, name: str = "candidate") -> Verdict:
        return self.judge_predictor(compiled_predictor(ov_model), name)

    def judge_predictor(self, predict, name: str = "candidate") -> Verdict:
        """The verdict on ``predict(feeds) -> [outputs]`` (a compiled candidate, in the model's output order)."""
        outputs = all_outputs(predict, self.samples, self.reference_outputs.names)
        quality = measure_outputs(name, outputs, self.samples.labels, self.reference_outputs,
                                  gated=self.gate.outputs, token_ids=self.token_ids, metric=self.gate.metric,
                                  targets=self.samples.targets)
        passed, check = self.gate.check(self.reference, quality)
        return Verdict(quality, passed, check, outputs)

    def worst_samples(self, verdict: Verdict, count: int) -> SampleSet:
        """The ``count`` samples ``verdict``'s candidate gets most wrong (lowest cosine of any gated output to the
        reference), picked as NNCF's accuracy control picks its ranking subset (``get_subset_indices``)."""
        from nncf.quantization.algorithms.accuracy_control.subset_selection import get_subset_indices

        if count >= len(self.samples):
            return self.samples
        names = self.reference_outputs.names
        worst = np.min([sample_cosines(out, ref) for name, out, ref in
                        zip(names, verdict.outputs.values, self.reference_outputs.values)
                        if not self.gate.outputs or name in self.gate.outputs], axis=0)
        return self.samples.pick(get_subset_indices((1.0 - worst).tolist(), count))

    @property
    def threshold(self) -> float:
        """The score the gate asks for (``score``'s pass line)."""
        if self.gate.metric is not None:
            return -self.gate.metric.allowed_drop(self.reference.metric.value)
        if self.reference.top1 is not None:
            return self.reference.top1 - self.gate.max_drop
        return self.gate.min_cosine

    def score(self, verdict: Verdict) -> float:
        """One number to compare two failing candidates (higher is closer to passing): minus the task metric's
        drop when the gate has one, the labelled top-1 when the gate is on top-1, else the worst gated output's
        cosine."""
        quality = verdict.quality
        if self.gate.metric is not None:
            return -self.gate.metric.drop(self.reference.metric.value, quality.metric.value)
        if self.reference.top1 is not None and quality.top1 is not None:
            return quality.top1
        gated = self.gate.gated(quality) or [quality.fidelity]
        return min(f.cosine for f in gated)

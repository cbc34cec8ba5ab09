"""Why INT8 lost accuracy: per-operation sensitivity of a quantized OpenVINO model (AIMET's QuantAnalyzer idea,
on NNCF's own accuracy-control machinery).

Each quantized operation is measured by keeping **only it in float**: NNCF's ``Ranker`` groups the quantizers
that must go together to revert an operation, and ``revert_operations_to_floating_point_precision`` removes
them from the INT8 model (restoring the original biases; the weights, still under FakeQuantize, are float) —
one graph edit and one pass over the ranking samples per operation, no recalibration. That is the cheaper of the two faithful measures (quantizing
only one operation would need a calibration per operation) and it is exactly what keeping the operation in
float buys. Each reverted model goes through the quality gate's own measures (``edgeopt.judge``): per-output
cosine and SQNR against the FP32 model, and the gate's figure (top-1 with labels, else the worst gated
cosine); operations are ranked by how much reverting them recovers that figure, then the worst output's SQNR.

Activation ranges, for the quantizers on each operation's inputs, from the FP32 model on the same samples:
``range_ratio`` = the largest channel's max |x| / the median channel's max |x| (channels: the axis a MatMul reads
reduces over, e.g. a transformer's hidden size, else axis 1 as in NCHW; an outlier channel, as
in SmoothQuant and LLM.int8(), stretches a per-tensor INT8 range for every other channel), and
``clipped`` = share of values outside the calibrated [input_low, input_high] of the FakeQuantize.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.evaluate import QualityGate
from edgeopt.judge import Judge, Verdict, compiled_predictor

METHOD = ("each quantized operation kept alone in float (NNCF Ranker groups, "
          "revert_operations_to_floating_point_precision), judged by the quality gate's measures vs FP32")


@dataclass(frozen=True)
class OpSensitivity:
    """One quantized operation (an NNCF group: the operations that revert together) and what keeping it in float
    recovers."""

    name: str  # the first operation (the one the report names)
    op_type: str
    operations: tuple[str, ...]  # every operation the group reverts (what ignored_scope must name)
    score: float  # the gate's figure with only this operation in float (Sensitivity.measure says which)
    gain: float  # score minus the INT8 model's: how much of the loss this operation accounts for
    cosine: dict[str, float]  # per output, with only this operation in float
    sqnr_db: dict[str, float]  # per output
    range_ratio: float | None = None  # largest / median channel max |x| of its activation inputs (worst)
    clipped: float | None = None  # share of activation values outside the calibrated range (worst)

    def describe(self) -> dict:
        described = asdict(self)
        described["operations"] = list(self.operations)
        return described


@dataclass(frozen=True)
class Sensitivity:
    method: str
    samples: int
    measure: str  # what ``score`` is
    int8_score: float
    int8_cosine: dict[str, float]
    int8_sqnr_db: dict[str, float]
    quantized_ops: int  # NNCF's count of quantized operations in the INT8 model
    ranked: tuple[OpSensitivity, ...]  # most sensitive first
    model: str  # which INT8 model was ranked (the repair ladder's rung that made it)
    seconds: float

    def describe(self) -> dict:
        described = asdict(self)
        described["ranked"] = [op.describe() for op in self.ranked]
        return described


class Reverter:
    """Keeps chosen quantized operations of an NNCF INT8 OpenVINO model in float, the way NNCF's accuracy control
    does: its ``Ranker`` groups the quantizers that must go together, ``revert_operations_to_floating_point_precision``
    removes them and restores the original biases. ``groups`` are keyed by their first operation."""

    def __init__(self, fp32_model, quantized_model):
        from nncf.openvino.graph.nncf_graph_builder import GraphConverter
        from nncf.quantization.algorithms.accuracy_control.algorithm import get_number_of_quantized_ops
        from nncf.quantization.algorithms.accuracy_control.openvino_backend import OVAccuracyControlAlgoBackend
        from nncf.quantization.algorithms.accuracy_control.ranker import Ranker

        self.model = quantized_model
        self.backend = OVAccuracyControlAlgoBackend()
        self.graph = GraphConverter.create_nncf_graph(quantized_model)
        # the original biases, on the quantized graph's nodes, undo bias correction (as NNCF's accuracy control
        # keeps them); the weights are not restored from the FP32 model as it does: with weights still under
        # FakeQuantize removing the quantizer restores them, and SmoothQuant has rescaled them to match its
        # rescaled activations (the FP32 weights would be wrong there)
        fp32_graph = GraphConverter.create_nncf_graph(fp32_model)
        for node in fp32_graph.get_all_nodes():
            if self.backend.is_node_with_bias(node, fp32_graph):
                self.graph.get_node_by_name(node.node_name).attributes["original_bias"] = \
                    self.backend.get_bias_value(node, fp32_graph, fp32_model)
        found = Ranker(1, None, self.backend, None).find_groups_of_quantizers_to_rank(self.graph)
        # a group reverting no operation (its quantizers feed none NNCF quantizes) has nothing to keep in float
        self.groups = {group.operations[0].node_name: group for group in found if group.operations}
        self.quantized_ops = get_number_of_quantized_ops(self.graph, self.backend.get_quantizer_metatypes(),
                                                         self.backend.get_quantizable_metatypes())

    def keep_in_float(self, names: list[str]):
        """A copy of the INT8 model with the groups named (by their first operation) in float."""
        from nncf.common.quantization.quantizer_removal import revert_operations_to_floating_point_precision
        from nncf.quantization.advanced_parameters import RestoreMode

        groups = [self.groups[name] for name in names]
        operations = list({op.node_name: op for g in groups for op in g.operations}.values())
        quantizers = list({q.node_name: q for g in groups for q in g.quantizers}.values())
        return revert_operations_to_floating_point_precision(
            operations, quantizers, self.model, self.graph, RestoreMode.ACTIVATIONS_AND_WEIGHTS,
            self.backend.get_op_with_weights_metatypes(), self.backend.is_node_with_weight,
            self.backend.get_weight_tensor_port_ids)


def analyse(fp32_model, quantized_model, samples: SampleSet, gate: QualityGate, output_names: list[str],
            quiet: bool = True, reverter: Reverter | None = None, judge: Judge | None = None,
            int8: Verdict | None = None, subset: str = "", model: str = "int8") -> Sensitivity:
    """Rank every quantized operation of ``quantized_model`` (an NNCF INT8 OpenVINO model of ``fp32_model``,
    weights still under FakeQuantize) on ``samples``. ``judge`` (on ``samples``) and ``int8`` (its verdict on
    ``quantized_model``): reused when the caller has them; ``subset``: how ``samples`` were chosen, in words;
    ``model``: which INT8 model ``quantized_model`` is, in the report."""
    import time

    from nncf.common.logging.track_progress import track

    start = time.perf_counter()
    reverter = reverter or Reverter(fp32_model, quantized_model)
    judge = judge or Judge(fp32_model, samples, gate, output_names)
    int8 = int8 or judge(quantized_model, "int8")
    int8_score = judge.score(int8)
    ranges = _activation_ranges(fp32_model, quantized_model, samples)
    measured = []
    groups = list(reverter.groups.items())
    for name, group in (groups if quiet else track(groups, description="Sensitivity per operation")):
        verdict = judge(reverter.keep_in_float([name]), name)
        activation = [ranges[q.node_name] for q in group.quantizers if q.node_name in ranges]
        score = judge.score(verdict)
        measured.append(OpSensitivity(
            name=name, op_type=group.operations[0].node_type,
            operations=tuple(op.node_name for op in group.operations), score=score, gain=score - int8_score,
            cosine=_cosines(verdict), sqnr_db=_sqnr(judge, verdict),
            range_ratio=max((r[0] for r in activation), default=None),
            clipped=max((r[1] for r in activation), default=None)))
    ranked = sorted(measured, key=lambda op: (op.gain, min(op.sqnr_db.values(), default=0.0)), reverse=True)
    measure = (f"minus the drop of the task metric's {gate.metric.primary}" if gate.metric is not None
               else "top-1" if judge.reference.top1 is not None and int8.quality.top1 is not None
               else "worst gated output's cosine")
    return Sensitivity(method=METHOD + (f"; on {subset}" if subset else ""), samples=len(samples), measure=measure,
                       int8_score=int8_score, int8_cosine=_cosines(int8), int8_sqnr_db=_sqnr(judge, int8),
                       quantized_ops=reverter.quantized_ops, ranked=tuple(ranked), model=model,
                       seconds=round(time.perf_counter() - start, 3))


def quantized_op_count(quantized_model) -> int:
    """NNCF's count of the quantized operations of an INT8 OpenVINO model."""
    from nncf.openvino.graph.nncf_graph_builder import GraphConverter
    from nncf.quantization.algorithms.accuracy_control.algorithm import get_number_of_quantized_ops
    from nncf.quantization.algorithms.accuracy_control.openvino_backend import OVAccuracyControlAlgoBackend

    backend = OVAccuracyControlAlgoBackend()
    return get_number_of_quantized_ops(GraphConverter.create_nncf_graph(quantized_model),
                                       backend.get_quantizer_metatypes(), backend.get_quantizable_metatypes())


def _cosines(verdict: Verdict) -> dict[str, float]:
    return {f.output: round(f.cosine, 6) for f in verdict.quality.outputs}


def _sqnr(judge: Judge, verdict: Verdict) -> dict[str, float]:
    """Signal-to-quantization-noise ratio per output, dB (capped at 200 dB for an exact match)."""
    figures = {}
    for name, out, ref in zip(judge.reference_outputs.names, verdict.outputs.values, judge.reference_outputs.values):
        ref = ref.astype(np.float64)
        noise = float(np.sum((out.astype(np.float64) - ref) ** 2))
        signal = float(np.sum(ref ** 2))
        figures[name] = round(min(200.0, 10 * np.log10(max(signal, 1e-300) / max(noise, 1e-300))), 3)
    return figures


def _activation_ranges(fp32_model, quantized_model, samples: SampleSet) -> dict[str, tuple[float, float]]:
    """Per activation FakeQuantize of ``quantized_model`` (by name): (range_ratio, clipped share) of the tensor it
    quantizes, taken from ``fp32_model`` (same producer name and port) on ``samples``."""
    fp32_ops = {op.get_friendly_name(): op for op in fp32_model.get_ops()}
    watched = {}  # FakeQuantize name -> (producer name, port, low, high)
    for op in quantized_model.get_ops():
        if op.get_type_name() != "FakeQuantize":
            continue
        source = op.input_value(0)
        producer = source.get_node()
        bounds = [op.input_value(i).get_node() for i in (1, 2)]
        if producer.get_type_name() == "Constant" or any(b.get_type_name() != "Constant" for b in bounds):
            continue  # a weight quantizer, or bounds that are not plain constants
        name = producer.get_friendly_name()
        if name in fp32_ops and source.get_index() < fp32_ops[name].get_output_size():
            watched[op.get_friendly_name()] = (name, source.get_index(), bounds[0].get_data(), bounds[1].get_data(),
                                               _channel_axis(op))
    if not watched:
        return {}
    probe = fp32_model.clone()
    probe_ops = {op.get_friendly_name(): op for op in probe.get_ops()}
    first_added = len(probe.outputs)
    keys = sorted(watched)
    probe.add_outputs([probe_ops[watched[k][0]].output(watched[k][1]) for k in keys])
    predict = compiled_predictor(probe)
    collected = {k: [] for k in keys}
    for sample in samples.samples:
        values = predict(sample)[first_added:]
        for key, value in zip(keys, values):
            collected[key].append(value)
    figures = {}
    for key in keys:
        _, _, low, high, axis = watched[key]
        stacked = [np.asarray(v, dtype=np.float64) for v in collected[key]]
        size = sum(v.size for v in stacked)
        ratio = _channel_range_ratio(stacked, axis)
        try:
            outside = sum(int(np.count_nonzero((v < low) | (v > high))) for v in stacked)
        except ValueError:  # bounds that do not broadcast to the tensor (should not happen): no figure
            continue
        figures[key] = (round(min(ratio, 1e6), 3), round(outside / size, 6))
    return figures


def _channel_axis(fake_quantize) -> int:
    """The channel axis of the tensor ``fake_quantize`` quantizes: the axis its first MatMul consumer reduces over
    (the hidden size of a transformer's activations), else 1 (NCHW)."""
    for target in fake_quantize.output(0).get_target_inputs():
        node = target.get_node()
        if node.get_type_name() == "MatMul":
            attrs = node.get_attributes()
            if target.get_index() == 0:
                return -2 if attrs.get("transpose_a") else -1
            return -1 if attrs.get("transpose_b") else -2
    return 1


def _channel_range_ratio(values: list[np.ndarray], axis: int = 1) -> float:
    """Largest over median per-channel max |x| (channels on ``axis``; every value its own channel for rank < 2)."""
    if values[0].ndim >= 2:
        peaks = np.max([np.abs(np.moveaxis(v, axis, 0).reshape(v.shape[axis], -1)).max(axis=1) for v in values],
                       axis=0)
    else:
        peaks = np.abs(np.concatenate([v.ravel() for v in values]))
    middle = float(np.median(peaks))
    return float(peaks.max() / middle) if middle > 0 else (1.0 if peaks.max() == 0 else 1e6)

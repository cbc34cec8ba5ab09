"""Recognise transformers, so that NNCF quantizes them as such (``nncf.ModelType.TRANSFORMER``: attention
patterns kept in float where they must be, SmoothQuant on MatMul inputs, the MIXED preset).

Evidence, strongest first: the source says so (a ``transformers`` model, a Hugging Face folder); a fused
attention op in the graph (OpenVINO ``ScaledDotProductAttention``, the form torch's SDPA converts to; ONNX
``Attention``/``MultiHeadAttention`` and other ``*Attention`` contrib ops); or attention spelled out as
MatMul(activations) → scale/mask → Softmax → MatMul, as older exports write it.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeopt.onnx_prep import weight_output_axis

TRANSFORMER, DEFAULT = "transformer", "default"
_PASS_THROUGH_DEPTH = 6  # ops (scale, mask add, reshape, convert...) allowed between a MatMul and the Softmax
# Activation functions as ONNX and OpenVINO name them; GELU/SiLU written out (x * 0.5 * (1 + erf(x / sqrt 2)),
# x * sigmoid(x)) are found through their arithmetic.
_ACTIVATIONS = {"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Relu", "LeakyRelu", "Elu", "Selu", "HardSwish",
                "HSwish", "Swish", "Softplus", "SoftPlus", "Mish", "Erf", "Tanh", "Sigmoid"}
_ARITHMETIC = {"Mul", "Div", "Add", "Multiply", "Divide"}
_LAYOUT = {"Reshape", "Transpose", "Cast", "Convert", "Flatten", "Squeeze", "Unsqueeze"}
_ACTIVATION_DEPTH = 4  # a spelled-out GELU: Mul(Mul(x, Add(Erf(Div(x)), 1)), 0.5)
_STATISTIC_DEPTH = 10  # ops from a normalisation's Sqrt up to its reduction: flax's variance as E[x^2] - E[x]^2,
# clamped, plus epsilon, broadcast (Sqrt <- Broadcast <- Add <- Reshape <- Maximum <- Subtract <- Multiply <- ReduceSum)


@dataclass(frozen=True)
class ModelType:
    name: str  # TRANSFORMER | DEFAULT
    reason: str
    normalisations: int = 0  # a default model's normalisations by a computed statistic (computed_normalisations)

    @property
    def is_transformer(self) -> bool:
        return self.name == TRANSFORMER

    def nncf(self):
        """The ``nncf.ModelType`` to pass to ``nncf.quantize`` (``None`` for the default)."""
        import nncf

        return nncf.ModelType.TRANSFORMER if self.is_transformer else None

    def describe(self) -> str:
        return f"{self.name} ({self.reason})"


def detect_model_type(source_hint: str | None = None, ov_model=None, onnx_model=None) -> ModelType:
    """The model type from the source's hint, else from the OpenVINO or ONNX graph (whichever is given)."""
    if source_hint == TRANSFORMER:
        return ModelType(TRANSFORMER, "a transformers model")
    for found in (_openvino_attention(ov_model) if ov_model is not None else None,
                  _onnx_attention(onnx_model) if onnx_model is not None else None):
        if found:
            return ModelType(TRANSFORMER, found)
    normalising = computed_normalisations(ov_model) if ov_model is not None else 0
    return ModelType(DEFAULT, "no attention in the graph" + (
        f"; {normalising} normalisation(s) by a computed statistic (a LayerNorm, RMSNorm, instance or L2 norm, "
        f"fused or written out), which NNCF quantizes as a CNN's ops unless model_type = \"transformer\""
        if normalising else ""),
        normalising)


def computed_normalisations(ov_model) -> int:
    """The activations divided by a statistic computed from them: OpenVINO's ``MVN`` (a LayerNorm it fused), and
    a ``Sqrt`` of a reduction that a ``Divide`` uses (a LayerNorm or RMSNorm written out, as JAX/flax exports by
    tf2onnx are: Magika's file-type classifier). NNCF quantizes them as any CNN op unless told the model is a
    transformer; on Magika the default INT8 read cosine 0.956, ``model_type = "transformer"`` 0.9999. Instance
    and L2 norms count too: the count only words the note, gives ``--repair`` its model_type rung (which is
    measured like any rung) and the failed gate's hint; it changes no default."""
    def divides(node) -> bool:
        return any(i.get_node().get_type_name() == "Divide" for o in node.outputs() for i in o.get_target_inputs())

    def reduced(node) -> bool:
        return _walk(node, lambda n: [v.get_node() for v in n.input_values()],
                     lambda n: n.get_type_name() in ("ReduceMean", "ReduceSum"), _STATISTIC_DEPTH)

    return sum(1 for op in ov_model.get_ops() if op.get_type_name() == "MVN"
               or (op.get_type_name() == "Sqrt" and divides(op) and reduced(op)))


def _openvino_attention(model) -> str | None:
    ops = list(model.get_ops())
    fused = sorted({op.get_type_name() for op in ops if op.get_type_name().endswith("Attention")})
    if fused:
        return f"fused attention op {', '.join(fused)}"
    count = sum(1 for op in ops if op.get_type_name() == "Softmax" and _ov_attention_softmax(op))
    return f"{count} MatMul-Softmax-MatMul attention block(s)" if count else None


def _ov_attention_softmax(softmax) -> bool:
    def activations_matmul(node) -> bool:
        return node.get_type_name() == "MatMul" and not any(_ov_is_constant(v.get_node()) for v in node.input_values())

    upstream = _walk(softmax, lambda n: [v.get_node() for v in n.input_values()], activations_matmul)
    downstream = _walk(softmax, lambda n: [i.get_node() for o in n.outputs() for i in o.get_target_inputs()],
                       lambda n: n.get_type_name() == "MatMul")
    return upstream and downstream


def _ov_is_constant(node) -> bool:
    while node.get_type_name() in ("Convert", "Reshape", "Transpose") and node.get_input_size():
        node = node.input_value(0).get_node()  # a compressed weight: Constant -> Convert (-> Reshape)
    return node.get_type_name() == "Constant"


def _onnx_attention(model) -> str | None:
    nodes = list(model.graph.node)
    fused = sorted({n.op_type for n in nodes if n.op_type.endswith("Attention")})
    if fused:
        return f"fused attention op {', '.join(fused)}"
    constants = {init.name for init in model.graph.initializer}
    constants |= {out for n in nodes if n.op_type == "Constant" for out in n.output}
    producer = {out: n for n in nodes for out in n.output}
    consumers: dict[str, list] = {}
    for n in nodes:
        for name in n.input:
            consumers.setdefault(name, []).append(n)

    def activations_matmul(node) -> bool:
        return node.op_type == "MatMul" and not any(_onnx_is_constant(name, constants, producer) for name in node.input)

    count = 0
    for softmax in (n for n in nodes if n.op_type == "Softmax"):
        upstream = _walk(softmax, lambda n: [producer[i] for i in n.input if i in producer], activations_matmul)
        downstream = _walk(softmax, lambda n: [c for o in n.output for c in consumers.get(o, [])],
                           lambda n: n.op_type == "MatMul")
        count += upstream and downstream
    return f"{count} MatMul-Softmax-MatMul attention block(s)" if count else None


def _onnx_is_constant(name: str, constants: set[str], producer: dict) -> bool:
    node = producer.get(name)
    while name not in constants and node is not None and node.op_type in ("Cast", "Reshape", "Transpose",
                                                                         "DequantizeLinear"):
        name = node.input[0]
        node = producer.get(name)
    return name in constants


def _walk(start, neighbours, found, depth: int = _PASS_THROUGH_DEPTH) -> bool:
    """Whether ``found`` holds for a node within ``depth`` steps of ``start`` (breadth first)."""
    frontier, seen = [start], set()
    for _ in range(depth):
        next_frontier = []
        for node in frontier:
            for neighbour in neighbours(node):
                key = id(neighbour) if not hasattr(neighbour, "get_friendly_name") else neighbour.get_friendly_name()
                if key in seen:
                    continue
                seen.add(key)
                if found(neighbour):
                    return True
                next_frontier.append(neighbour)
        frontier = next_frontier
    return False


def ffn_down_projections(ov_model=None, onnx_model=None) -> list[str]:
    """Names of the MatMul/Gemm nodes with a constant weight fed (through layout ops) by an activation function
    that narrow their input (fewer output features than input ones, where the shapes say): a transformer FFN's
    second projection. Its input carries the outlier neurons of trained BERT-class models, so per-tensor INT8
    there costs most of the fidelity (measured on all-MiniLM-L6-v2: worst-output cosine 0.981 → 0.995 in
    OpenVINO with these in float). A widening one is a head, not an FFN: PP-OCRv5's recogniser ends in a
    120 -> 18385 CTC classifier behind a hard-swish, 53% of its weights, which float kept its IR at 0.70x FP32
    (0.30x in int8, the same cosine, measured in a new-user trial)."""
    if ov_model is not None:
        def parents(node):
            return [v.get_node() for v in node.input_values()]

        def kind(node):
            return node.get_type_name()

        matmuls = [(op, op.get_friendly_name()) for op in ov_model.get_ops() if op.get_type_name() == "MatMul"
                   and _ov_is_constant(op.input_value(1).get_node()) and not _ov_widens(op)]
    else:
        constants = {init.name for init in onnx_model.graph.initializer}
        producer = {out: n for n in onnx_model.graph.node for out in n.output}

        def parents(node):
            return [producer.get(name) for name in node.input]

        def kind(node):
            return node.op_type

        weights = {init.name: tuple(init.dims) for init in onnx_model.graph.initializer}
        matmuls = [(n, n.name) for n in onnx_model.graph.node if n.op_type in ("MatMul", "Gemm") and n.name
                   and len(n.input) > 1 and _onnx_is_constant(n.input[1], constants, producer)
                   and not _onnx_widens(n, weights.get(n.input[1]))]

    def activation(node, depth: int) -> bool:
        if node is None or depth == 0:
            return False
        if kind(node) in _ACTIVATIONS:
            return True
        return kind(node) in _ARITHMETIC and any(activation(p, depth - 1) for p in parents(node))

    found = []
    for matmul, name in matmuls:
        source = parents(matmul)[0]
        while source is not None and kind(source) in _LAYOUT:
            source = parents(source)[0]
        if activation(source, _ACTIVATION_DEPTH):
            found.append(name)
    return found


def _ov_widens(matmul) -> bool:
    """Whether an OpenVINO MatMul has more output features than input ones (False where a shape is dynamic)."""
    transpose_a = matmul.get_attributes().get("transpose_a", False)
    given, made = matmul.get_input_partial_shape(0), matmul.get_output_partial_shape(0)
    if given.rank.is_dynamic or made.rank.is_dynamic or given.rank.get_length() < 2:
        return False
    features_in = given[-2 if transpose_a else -1]
    features_out = made[-1]
    return features_in.is_static and features_out.is_static and features_out.get_length() > features_in.get_length()


def _onnx_widens(node, weight: tuple[int, ...] | None) -> bool:
    """Whether an ONNX MatMul/Gemm's 2-D constant weight has more output features than input ones."""
    if weight is None or len(weight) != 2:
        return False
    out_axis = weight_output_axis(node, 2)
    return weight[out_axis] > weight[1 - out_axis]


"""How much arithmetic an ONNX CNN does per activation element, and whether int8 compute can pay for itself.

ONNX Runtime's int8 CPU kernels save time in proportion to multiply-accumulates and spend it in proportion to
the activation elements they quantize, dequantize and requantize, plus one quantized element-wise op for every
activation that does not fold into QLinearConv (only Relu and Clip do; Sigmoid, HardSigmoid, HardSwish, PRelu...
become QLinear ops of their own or a dequantize/quantize pair around a float one). A depthwise-heavy net with
such activations does too little work per element for int8 to win. Measured by edgeopt's own race in two bench
runs (``bench/conformance.py``, ONNX Runtime 1.32, 2 threads, interleaved rounds): the p50 of quantize_static's
recipe (``ort``) over that of int8 weights with float compute (``weights-only``) on the same normalised graph:

| model | MACs per element | unfolded activations | int8 / float compute p50 |
|---|---|---|---|
| PP-OCR cls (PP-LCNet x0.25, 48x192; hard-swish, SE) | 13.6 | 0.50 | 1.62-2.11 |
| MobileNetV2 x0.35, 64x64 (ReLU6) | 11.2 | 0 | 0.75-0.83 |
| MobileNetV2 (ReLU6) | 22.4 | 0 | 0.36-0.42 |
| EfficientNet-B0 (SiLU, SE) | 28.4 | 0.79 | 0.84-1.10 |
| PP-OCR det (MobileNetV3; hard-swish) | 44.9 | 0.53 | 0.55-0.84 |
| MTCNN ONet (PReLU) | 95.9 | 0.62 | 0.91-0.96 |
| ResNet-18 | 389 | 0 | 0.31-0.46 |

YOLOv8n (nudenet 320n; SiLU) has 117 MACs per element, 0.89 unfolded: its int8 graph ran 0.69x FP32's p50.
So int8 compute is kept unless both hold: fewer than ``FLOAT_COMPUTE_INTENSITY`` MACs per element and at least
``FLOAT_COMPUTE_ACTIVATIONS`` of the compute ops followed by an activation int8 cannot fold. The line sits between
the clear case and EfficientNet's tie, which keeps int8 compute (its weights stay int8 in memory too; float
compute holds float weights once loaded). A static rule, not a race: the same model gives the same file on every
run (a speed race between the two kinds flipped on a tiny CNN under CI load).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeopt.onnx_prep import probe_tensors, tensor_readers

COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
FOLDED_ACTIVATIONS = ("Relu", "Clip")  # what ONNX Runtime folds into QLinearConv/QLinearMatMul
# activations that do not fold: their own int8 op, or float between a dequantize and a quantize
ACTIVATIONS = ("Sigmoid", "HardSigmoid", "HardSwish", "Swish", "PRelu", "LeakyRelu", "Tanh", "Elu", "Selu", "Celu",
               "Softplus", "Softsign", "Mish", "Gelu", "Erf")
FLOAT_COMPUTE_INTENSITY = 20.0  # MACs per activation element below which int8 compute may not pay
FLOAT_COMPUTE_ACTIVATIONS = 0.5  # share of compute ops followed by an unfolded activation from which it may not


@dataclass(frozen=True)
class Work:
    """A graph's compute ops, their arithmetic and their activations."""

    compute_ops: int
    macs: int  # multiply-accumulates of one call (the calibration sample's shapes)
    elements: int  # activation elements the compute ops read and write
    unfolded_activations: int  # compute ops whose output feeds an activation int8 cannot fold

    @property
    def intensity(self) -> float:
        return self.macs / self.elements if self.elements else 0.0

    @property
    def activation_share(self) -> float:
        return self.unfolded_activations / self.compute_ops if self.compute_ops else 0.0

    @property
    def float_compute(self) -> bool:
        """Whether int8 kernels are expected to cost more than they save (the module's rule)."""
        return (self.compute_ops > 0 and self.intensity < FLOAT_COMPUTE_INTENSITY
                and self.activation_share >= FLOAT_COMPUTE_ACTIVATIONS)

    def describe(self) -> dict:
        return {"compute_ops": self.compute_ops, "macs": self.macs, "macs_per_activation_element":
                round(self.intensity, 2), "unfolded_activation_share": round(self.activation_share, 3),
                "compute": "float" if self.float_compute else "int8",
                "rule": (f"float compute (int8 weights) when fewer than {FLOAT_COMPUTE_INTENSITY:g} MACs per "
                         f"activation element and at least {FLOAT_COMPUTE_ACTIVATIONS:.0%} of the compute ops "
                         f"followed by an activation int8 cannot fold (not {'/'.join(FOLDED_ACTIVATIONS)})")}


def work_of(model, sample: dict) -> Work:
    """The :class:`Work` of ``model``'s Conv/ConvTranspose/Gemm/MatMul on ``sample`` (one run of ONNX Runtime
    for the activation shapes, so dynamic axes take the sample's sizes)."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    nodes = [n for n in graph.node if n.op_type in COMPUTE_OPS and len(n.input) > 1]
    if not nodes:
        return Work(0, 0, 0, 0)
    probed = {t for n in nodes for t in n.input[:2] if t not in inits} | {n.output[0] for n in nodes}
    shapes = {name: value.shape for name, value in next(probe_tensors(model, sorted(probed), [sample])).items()}
    shapes.update({name: tuple(init.dims) for name, init in inits.items()})
    readers = tensor_readers(graph)
    macs = elements = unfolded = 0
    for node in nodes:
        x, w, y = (shapes[name] for name in (node.input[0], node.input[1], node.output[0]))
        elements += (0 if node.input[0] in inits else _size(x)) + _size(y)
        macs += _macs(node, x, w, y)
        unfolded += any(r.op_type in ACTIVATIONS for r in readers.get(node.output[0], []))
    return Work(len(nodes), int(macs), int(elements), int(unfolded))


def _size(shape: tuple) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _macs(node, x: tuple, w: tuple, y: tuple) -> int:
    """Multiply-accumulates of one call from the shapes of input 0 ``x``, input 1 ``w`` and the output ``y``: each
    output element of a Conv sums over its kernel and input channels per group (the weight's dims after the
    first); of a ConvTranspose each input element over the weight's other dims; of a Gemm/MatMul over the shared
    dimension."""
    if node.op_type == "Conv":
        return _size(y) * _size(w[1:])
    if node.op_type == "ConvTranspose":
        return _size(x) * _size(w[1:])
    if node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute):
        return _size(y) * (x[0] if x else 1)
    return _size(y) * (x[-1] if x else 1)

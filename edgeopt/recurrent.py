"""Recurrent cells (LSTM, GRU, RNN) under INT8: which scope the IR gets, and where the cells' weights go int8.

OpenVINO: NNCF quantizes an ``LSTMSequence``'s input X and its weights W/R (its CPU hardware config), and the CPU
plugin may then run the cell as an INT8 primitive that loses the state. Measured (OpenVINO 2026.4.1, NNCF 3.4.0,
f32 pinned, the IR saved and read back; in memory it read 0.998) on a one-step ``nn.LSTM(64, 128)`` behind a
ReLU with its state in and out: state cosine 0.41 with NNCF's quantizers, 0.41 with the FakeQuantize right before
X removed, 0.54 with X's range widened to hold the hidden state's [-1, 1], 0.998 with W/R stored float (X still
quantized) and 0.998 with the cell in NNCF's ignored scope. The plugin has no weight-only recurrent cell: W/R
stored as int8 behind a Convert/Multiply with float activations is refused at compile time ("expects Constant
for port 4"), so a float cell keeps FP16 weights in the IR. NNCF itself leaves a ``GRUSequence`` with
``linear_before_reset`` (PyTorch's GRU) float.

The state also carries every quantization error upstream of the cell into the next call, so the float scope
keeps the element-wise ops float too and quantizes only the compute ops (convolutions, MatMul, embedding
Gathers; :func:`openvino_float_ops`). Measured on Silero VAD (``silero_vad.onnx``, its LSTM float, 16 held-out
stream chunks, IR read back): ``stateN`` cosine 0.951 with NNCF's default scope, 0.9964 with only its
spectrogram magnitude (Pow, Add, Sqrt) float.

Not every INT8 cell loses its state (the bench's ``lstm-stateful``, an embedding into a 32-step LSTM: 0.9999 from
the file), and which do was not pinned down, so :func:`choose_scope` measures: NNCF's scope and the float scope,
each saved and read back, the float scope kept only when it is the more faithful.

ONNX Runtime has no static INT8 recurrent kernel (``quantize_static`` leaves LSTM/GRU float): a recurrent
model gets the compute-only candidates (NNCF with the float scope, ``ort-conv``), and its cells the most compressed
of ONNX Runtime's DynamicQuantizeLSTM (GRU/RNN: W/R int8, rebuilt in float at load), W/R int8 with float compute,
or float, within ``TOLERANCE`` of the best measured with only the cells quantized
(``edgeopt.passes.onnx_int8.recurrent_mode``, ``quantize_recurrent``).
"""

from __future__ import annotations

OPENVINO_CELLS = ("LSTMSequence", "GRUSequence", "RNNSequence", "LSTMCell", "GRUCell", "RNNCell")
ONNX_CELLS = ("LSTM", "GRU", "RNN")
OPENVINO_COMPUTE = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData",
                    "MatMul")
OPENVINO_STRUCTURE = ("Parameter", "Constant", "Result", "Gather")  # Gather: an embedding's weights quantize
SAMPLES = 16  # calibration samples the two scopes are compared on
TOLERANCE = 0.001  # NNCF's scope is kept unless the float scope's worst-output cosine is higher by more
ONNX_WEIGHT_INPUTS = (1, 2)  # W and R: [num_directions, gates * hidden, input or hidden]
ONNX_WEIGHT_AXIS = 1  # their rows: one scale per gate and hidden unit


def openvino_cells(ov_model) -> list[str]:
    """Friendly names of the recurrent cells of ``ov_model`` (outside ``If`` bodies)."""
    return [op.get_friendly_name() for op in ov_model.get_ops() if op.get_type_name() in OPENVINO_CELLS]


def has_onnx_cells(onnx_model) -> bool:
    """Whether ``onnx_model``'s main graph has a recurrent cell."""
    return any(node.op_type in ONNX_CELLS for node in onnx_model.graph.node)


def openvino_float_ops(ov_model) -> list[str]:
    """In a model with recurrent cells, the friendly names of its cells and of every other op but the compute
    ops (``OPENVINO_COMPUTE``): what NNCF's ignored scope keeps float. Empty for a model without cells."""
    if not openvino_cells(ov_model):
        return []
    return [op.get_friendly_name() for op in ov_model.get_ops()
            if op.get_type_name() not in OPENVINO_COMPUTE + OPENVINO_STRUCTURE]


def choose_scope(ov_model, samples: list[dict], float_ops: list[str], quantize) -> tuple[object, list[str], str]:
    """``quantize(model, extra_ignored)`` with NNCF's scope (``[]``) and with ``float_ops`` float; each model is
    written to an IR and read back (the in-memory model reads better than the file, see above) and compared with
    ``ov_model`` on ``samples`` by its worst output's cosine. Returns the model kept, the names it keeps float
    and a note with both figures."""
    from edgeopt.passes.closest import quantize_closest

    scopes = {"NNCF's scope": [], "recurrent cells and element-wise ops float": float_ops}
    kept = quantize_closest(ov_model, samples[:SAMPLES], scopes, quantize, tolerance=TOLERANCE, read_back=True)
    figures = f"worst-output cosine of the IR read back on {kept.samples} calibration samples: {kept.figures}"
    halved = cell_weights_fp16(kept.model)  # float cell weights either way: NNCF's scope leaves a GRU's FP32 too
    stored = f", the cells' {halved} float weight tensor(s) stored FP16" if halved else ""
    if kept.choice:
        return kept.model, float_ops, (f"recurrent cells and {len(float_ops)} non-compute op(s) kept float"
                                       f"{stored} ({figures})")
    return kept.model, [], f"recurrent cells quantized as NNCF does{stored} ({figures})"


def cell_weights_fp16(ov_model) -> int:
    """Store the FP32 constant W, R and B of ``ov_model``'s recurrent cells as FP16 behind a Convert (in place;
    the plugin computes in FP32 as before): ``ov.save_model``'s FP16 compression skips a quantized model, so a
    float cell in an INT8 IR kept FP32 weights — resemblyzer's speaker encoder, whose 3 LSTMs hold 95% of its
    weights, came out 0.97x FP32's size. Returns how many tensors were stored so."""
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    halved = 0
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() not in OPENVINO_CELLS:
            continue
        for port in op.inputs():
            source = port.get_source_output()
            node = source.get_node()
            if node.get_type_name() != "Constant" or node.get_output_element_type(0) != ov.Type.f32:
                continue
            if int(np.prod(list(node.get_output_shape(0)))) < 2:  # a scalar (clip, sequence length): not weights
                continue
            weights = ops.constant(node.get_data().astype(np.float16))
            port.replace_source_output(ops.convert(weights, ov.Type.f32).output(0))
            halved += 1
    return halved

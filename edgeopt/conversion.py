"""The converted FP32 graphs checked against the source, before any compression.

A converter can compute another function than the model it converts: OpenVINO's ONNX frontend ignores an LSTM's
peephole weights (its input ``P``), and madmom's beat-tracking BLSTM (6 peephole LSTMs) read cosine 0.21 to the
ONNX file as an FP32 IR, which the gate then blamed on INT8, and ``--repair`` (judged against that IR) reported
fixed. Each format the user asked for that is converted (an IR from an ONNX file or a PyTorch model, an ONNX
export of a PyTorch model) runs on a few calibration samples in FP32 beside the source in its own framework; a
worst gated output below the quality gate's cosine (at most ``MIN_COSINE``: no conversion is bit-exact, and a
stricter gate is the gate's to judge) is refused in one line, naming the format, the output and, where known,
the cause (with a task metric, which may still pass, it is a note).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeopt.errors import BadInputError

SAMPLES = 8  # calibration samples each converted graph is compared with the source on
MIN_COSINE = 0.99  # the check's cosine, or the gate's where that is lower


def check_conversions(source, graphs: dict, samples: list[dict], formats: tuple[str, ...], gate,
                      source_predictor: Callable[[], Callable[[dict], list[np.ndarray]]]) -> list[str]:
    """Refuse (``BadInputError``) a converted graph of ``formats`` (in ``graphs``, before graph steps) whose worst
    gated output's fidelity to the source (``source_predictor()``: the source in its own framework, built only
    when a graph is checked), measured as the gate measures it (:func:`edgeopt.evaluate.measure_outputs`) on the
    first ``SAMPLES`` of ``samples``, is below the ``gate``'s (``edgeopt.evaluate.QualityGate``) ``min_cosine``
    or ``MIN_COSINE``, whichever is lower; with a task metric, return it as a note instead. Graphs in the
    source's own format are the source, and are not checked. It runs with or without evaluation data: a
    conversion that computes another function is no artifact to write."""
    from edgeopt.data import SampleSet
    from edgeopt.dynamic_axes import onnx_runner, openvino_runner
    from edgeopt.evaluate import all_outputs, measure_outputs
    from edgeopt.formats import FORMATS

    checked = [fmt for fmt in formats if fmt in graphs and fmt != source.kind]
    subset = SampleSet(samples[:SAMPLES], None, "calibration")
    if not checked or not subset.samples:
        return []
    try:
        reference = all_outputs(source_predictor(), subset, source.output_names)
    except Exception:  # noqa: BLE001 - the evaluation, which runs it too, says why
        return []
    notes = []
    for fmt in checked:
        try:
            run = openvino_runner if fmt == "openvino" else onnx_runner  # FP32: graphs compared, not precisions
            outputs = all_outputs(run(graphs[fmt]), subset, reference.names)
        except Exception:  # noqa: BLE001 - a graph that does not run here is the evaluation's to report
            continue
        if len(outputs.values) != len(reference.values) or any(
                o.shape != r.shape for o, r in zip(outputs.values, reference.values)):
            continue
        worst = measure_outputs(fmt, outputs, None, reference, gated=gate.outputs).fidelity
        floor = min(gate.min_cosine, MIN_COSINE)
        if worst is None or worst.cosine >= floor:
            continue
        cause = "".join(f"; {line}" for line in _known_causes(fmt, source))
        other = [f for f in FORMATS if f != fmt and f in ("openvino", "onnx")]
        message = (f"{FORMATS[fmt].label}: the FP32 conversion already misses the gate, before any compression "
                   f"(output '{worst.output}': cosine {worst.cosine:.5f} to the source in its own framework on "
                   f"{len(subset)} calibration sample(s), min {floor:g}){cause}")
        if gate.metric is not None:
            notes.append(f"{message}; the task metric decides")
            continue
        raise BadInputError(f"{message}; --format {','.join(other)} leaves this format out")
    return notes


def _known_causes(fmt: str, source) -> list[str]:
    """What in the source is known to convert wrongly to ``fmt``."""
    if fmt != "openvino" or source.kind != "onnx":
        return []
    import onnx

    from edgeopt.onnx_prep import all_nodes

    model = onnx.load(str(source.path), load_external_data=False)
    peepholes = [node.name or node.output[0] for node in all_nodes(model.graph)
                 if node.op_type == "LSTM" and len(node.input) > 7 and node.input[7]]
    if not peepholes:
        return []
    return [f"{len(peepholes)} LSTM(s) ({', '.join(peepholes[:3])}{', ...' if len(peepholes) > 3 else ''}) have "
            "peephole weights (input P), which OpenVINO's ONNX frontend ignores"]

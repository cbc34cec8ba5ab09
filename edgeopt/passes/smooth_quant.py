"""SmoothQuant for transformers, chosen by measurement.

NNCF applies SmoothQuant (alpha 0.95 on MatMul inputs) to every model quantized as a transformer. On a trained
BERT-class encoder (all-MiniLM-L6-v2, ``bench/transformer_int8.py``) that keeps the pooled sentence embedding
close but moves ``last_hidden_state`` far off (cosine 0.80 against 0.98 without it), so edgeopt quantizes both
ways and keeps the one whose worst output is closer to the FP32 model's on a few samples — the gate's measure.
"""

from __future__ import annotations

from edgeopt.passes.closest import quantize_closest

CANDIDATES = {"SmoothQuant alpha 0.95 (NNCF's default)": 0.95, "no SmoothQuant": -1.0}
SAMPLES = 32  # enough to rank two candidates; the gate measures the winner on all of the evaluation data


def smooth_quant_parameters(alpha: float):
    """NNCF's advanced parameters with SmoothQuant ``alpha`` on MatMul inputs (-1: off)."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedSmoothQuantParameters

    return nncf.AdvancedQuantizationParameters(smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=alpha))


def quantize_choosing_smooth_quant(ov_model, samples: list[dict], quantize) -> tuple[object, float, str]:
    """``quantize(model, alpha)`` for each candidate; return the model with the best worst-output
    cosine on ``samples`` (calibration samples), its alpha, and a note with every candidate's figure."""
    kept = quantize_closest(ov_model, samples[:SAMPLES], CANDIDATES, quantize)
    return kept.model, kept.choice, (f"{kept.label}, chosen by worst-output cosine on {kept.samples} calibration "
                                     f"samples ({kept.figures})")

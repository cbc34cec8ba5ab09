"""The presets ``preset = "auto"`` quantizes with: NNCF's for the model type (MIXED, asymmetric activations, for
transformers; PERFORMANCE, symmetric, for the rest), and for a CNN whose activations have a negative tail (SiLU,
GELU, PReLU...) both, keeping the one closer to FP32 (``edgeopt.passes.closest``).

Why both: under PERFORMANCE a signed activation keeps about half of the 256 levels (a SiLU output spans -0.28 to
tens), and NNCF's documentation recommends MIXED for non-ReLU activations; but measured, MIXED is not always the
better. edgeopt's int8 IR, held-out cosine to FP32 (bench/conformance.py, 32 calibration / 16 held-out images,
NNCF 3.4.0, OpenVINO 2026.4.1):

| model (trained) | activation | PERFORMANCE | MIXED |
|---|---|---|---|
| ddddocr 1.6.1's YOLOX detector | Swish | 0.963 | 0.996 |
| PP-OCRv4 detector | HSwish | 0.9949 | 0.9969 |
| PP-OCR v2 direction classifier | HSwish | 0.9999 | 0.9991 |
| MTCNN ONet, landmarks output | PRelu | 0.972 | 0.890 |
"""

from __future__ import annotations

PERFORMANCE, MIXED = "performance", "mixed"
# OpenVINO activation ops whose output goes below zero, but not as far as above it (spelled-out SiLU and GELU are
# fused into Swish and Gelu by ov.convert_model; LeakyReLU converts to PRelu). ReLU, ReLU6 (Clamp), Sigmoid and
# HSigmoid are never negative: both presets give them the same range.
NEGATIVE_TAIL = ("Swish", "HSwish", "Gelu", "Mish", "Elu", "Selu", "PRelu")
SAMPLES = 32  # calibration samples the presets are compared on; the gate measures the one kept on all


def negative_tail_activations(ov_model) -> list[str]:
    """The op types of ``ov_model``'s activations with a negative tail (``NEGATIVE_TAIL``), sorted."""
    return sorted({op.get_type_name() for op in ov_model.get_ops() if op.get_type_name() in NEGATIVE_TAIL})


def auto_presets(ov_model, transformer: bool) -> tuple[str, ...]:
    """The presets ``auto`` tries on ``ov_model``, NNCF's for its model type first (the one a tie keeps)."""
    if transformer:
        return (MIXED,)
    return (PERFORMANCE, MIXED) if negative_tail_activations(ov_model) else (PERFORMANCE,)

"""The presets ``preset = "auto"`` quantizes with: NNCF's for the model type (MIXED, asymmetric activations, for
transformers; PERFORMANCE, symmetric, for the rest), and for a CNN whose activations have a negative tail (SiLU,
GELU, PReLU...) both, keeping MIXED only where it is closer to FP32 (``edgeopt.passes.closest``).

Why both: under PERFORMANCE a signed activation keeps about half of the 256 levels (a SiLU output spans -0.28 to
tens), and NNCF's documentation recommends MIXED for non-ReLU activations; but measured, MIXED is not always the
better. Held-out cosine of edgeopt's int8 IR to FP32 (NNCF 3.4.0, OpenVINO 2026.4.1):

| model (trained) | activation | PERFORMANCE | MIXED |
|---|---|---|---|
| ddddocr 1.6.1's YOLOX detector, captcha images | Swish | 0.963 | 0.996 |
| PP-OCRv4 detector (bench/conformance.py) | HSwish | 0.9949 | 0.9969 |
| PP-OCR v2 direction classifier (bench) | HSwish | 0.9999 | 0.9991 |
| MTCNN ONet, landmarks output (bench) | PRelu | 0.972 | 0.890 |
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edgeopt.recurrent import openvino_cells

PERFORMANCE, MIXED = "performance", "mixed"
# OpenVINO activation ops whose output goes below zero, but not as far as above it (spelled-out SiLU and GELU are
# fused into Swish and Gelu by ov.convert_model; LeakyReLU converts to PRelu). ReLU, ReLU6 (Clamp), Sigmoid and
# HSigmoid are never negative: both presets give them the same range.
NEGATIVE_TAIL = ("Swish", "HSwish", "Gelu", "Mish", "Elu", "Selu", "PRelu")
SAMPLES = 32  # calibration samples the presets are compared on; the gate measures the one kept on all
TOLERANCE = 0.0005  # MIXED is kept only when its worst-output cosine is higher than PERFORMANCE's by more


@dataclass(frozen=True)
class PresetChoice:
    """The preset the ``int8`` step used, and why (the report's ``decisions.int8``)."""

    name: str  # PERFORMANCE | MIXED
    chosen_by: str  # "recipe" | "rule" | "measurement"
    reason: str
    cosines: dict[str, float] | None = None  # measurement: worst-output cosine per preset on `samples` samples
    samples: int | None = None

    def describe(self) -> dict:
        return asdict(self)

    def note(self) -> str:
        if self.cosines is None:
            return f"{self.name} ({self.reason})"
        figures = ", ".join(f"{name}: {cosine:.4f}" for name, cosine in self.cosines.items())
        return (f"{self.name} (chosen by worst-output cosine on {self.samples} calibration samples: {figures}; "
                f"{self.reason})")


@dataclass(frozen=True)
class AutoPresets:
    presets: tuple[str, ...]  # NNCF's for the model type first: the one a tie keeps
    reason: str


def negative_tail_activations(ov_model) -> list[str]:
    """The activations with a negative tail (``NEGATIVE_TAIL``) in ``ov_model``, by op type (PRelu named
    "PRelu/LeakyRelu": OpenVINO reads both as PRelu), sorted."""
    found = {op.get_type_name() for op in ov_model.get_ops() if op.get_type_name() in NEGATIVE_TAIL}
    return sorted("PRelu/LeakyRelu" if name == "PRelu" else name for name in found)  # OpenVINO reads both as PRelu


def auto_presets(ov_model, transformer: bool) -> AutoPresets:
    """The presets ``auto`` tries on ``ov_model``, and why. A model with recurrent cells is not measured: its
    ``int8`` step measures the cells' float scope instead (``edgeopt.recurrent``)."""
    if transformer:
        return AutoPresets((MIXED,), "NNCF's for transformers")
    found = negative_tail_activations(ov_model)
    kind = "models that are not transformers"  # NNCF's default: CNNs, recurrent nets, MLPs alike
    if not found:
        return AutoPresets((PERFORMANCE,), f"NNCF's for {kind}: no activation with a negative tail")
    if openvino_cells(ov_model):
        return AutoPresets((PERFORMANCE,), f"NNCF's for {kind}; {', '.join(found)} activations have a negative "
                                           "tail, but a model with recurrent cells is not measured")
    return AutoPresets((PERFORMANCE, MIXED), f"{', '.join(found)} activations have a negative tail")

"""What every pass works on: the model as it moves through a recipe, and the context the pipeline hands it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeopt.data import SampleSet
    from edgeopt.source import SourceModel


@dataclass
class WorkingModel:
    """The model as it moves through a recipe: the PyTorch module before conversion, one graph per format after.

    ``graphs`` maps a format name of ``edgeopt.formats`` to its in-memory model (``openvino.Model``,
    ``onnx.ModelProto``); the OpenVINO graph is always there once converted (it is the reference the
    heuristics, size baselines and step report read), the others only when that format is written.
    """

    source: SourceModel
    torch_module: Any = None  # current PyTorch module (torch sources only)
    graphs: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"  # weight precision label of the result: fp32, fp16, int8, int4/int8 weights, ...
    float_weights_fp16: bool = False  # store the float constants that remain as FP16 (set by the precision passes)
    notes: list[str] = field(default_factory=list)  # choices a pass made, for the report
    decisions: dict[str, Any] = field(default_factory=dict)  # measured choices a pass made, for report.json
    reproduce: dict[str, dict] = field(default_factory=dict)  # step name -> the step that redoes what it found

    @property
    def ov_model(self):
        """The OpenVINO graph (``None`` before conversion)."""
        return self.graphs.get("openvino")

    def converted(self) -> bool:
        return bool(self.graphs)


@dataclass
class PassContext:
    """What the pipeline hands every pass besides the model (Olive's accelerator spec and data configs)."""

    calibration: SampleSet
    seed: int = 0
    quiet: bool = False  # no progress bars
    evaluation: SampleSet | None = None  # held-out data (with labels when given), for accuracy-aware passes
    train: SampleSet | None = None  # training data for torch passes that fine-tune (else the calibration set)
    target: Any = None  # the loaded edgeopt.targets.Target the result is for, when there is one
    gate: Any = None  # the edgeopt.evaluate.QualityGate the result must pass (accuracy-aware passes aim for it)

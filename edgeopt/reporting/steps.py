"""What each recipe step bought: parameters, MACs, IR size, accuracy/fidelity and latency p50 after every step.

After each step the working model is saved as OpenVINO IR (as ``save_artifacts`` would) and run on the evaluation
data (accuracy on the labelled output, fidelity to the original's outputs: the worst of the gated outputs, as the
quality gate judges, and the user's task metric when the gate has one: its primary value, the figure the gate
decides on). When the recipe is done, every step's IR is timed at batch 1
with pinned runtime settings, in interleaved rounds, so that load from other processes hits every step alike and
the "faster" column compares steps rather than moments.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from edgeopt.data import SampleSet
from edgeopt.device.host import host_info
from edgeopt.device.measure import time_interleaved
from edgeopt.device.runtime import OpenVINOSession, RuntimeSettings, random_feeds, runtime_version
from edgeopt.device.stats import latency_stats
from edgeopt.device.task_metric import MetricSpec
from edgeopt.evaluate import Outputs, all_outputs, measure_outputs, torch_predictor
from edgeopt.formats import FORMATS, REFERENCE
from edgeopt.passes.base import WorkingModel
from edgeopt.source import SourceModel, to_openvino


@dataclass(frozen=True)
class StepRow:
    step: str
    params: int | None  # from torch-pruning's count_ops_and_params (None for ONNX / IR sources)
    macs: int | None
    ir_bytes: int  # .xml + .bin as saved
    precision: str
    top1: float | None  # on the report's data, when it has labels (the labelled output)
    cosine: float | None  # mean cosine similarity to the original's, of the worst gated output
    metric: float | None  # the task metric's primary value (StepReport.metric names it), when the gate has one
    p50_ms: float  # filled in by StepRecorder.finish, which times all steps together


@dataclass
class StepReport:
    data: str
    samples: int
    settings: RuntimeSettings
    runs: int
    warmup: int
    rounds: int
    metric: MetricSpec | None = None  # the gate's task metric, evaluated after every step
    rows: list[StepRow] = field(default_factory=list)

    def describe(self) -> dict:
        return {
            "measured_with": {
                "latency": f"OpenVINO {runtime_version('openvino')}, batch 1, {self.warmup} warm-up + {self.runs} "
                           f"timed synchronous inferences per step on random inputs bound once, in {self.rounds} "
                           f"rounds interleaved across the steps, p50",
                "settings": self.settings.describe(),
                "host_cpu": host_info().cpu_model,
                "quality": f"{self.samples} samples of {self.data}, OpenVINO with the same settings",
                "params_macs": "torch_pruning.utils.count_ops_and_params on the PyTorch module",
            },
            "metric": self.metric.describe() if self.metric else None,
            "rows": [asdict(row) for row in self.rows],
        }


class StepRecorder:
    """Callable the pipeline invokes after each step with ``(label, working_model)``; ``finish`` times the steps."""

    def __init__(self, source: SourceModel, data: SampleSet, threads: int | None = None, runs: int = 200,
                 warmup: int = 20, rounds: int = 10, gated: tuple[str, ...] = (), metric: MetricSpec | None = None):
        threads = threads or host_info().usable_cpus
        self.source = source
        self.data = data
        self.report = StepReport(data.source, len(data), RuntimeSettings(inference_precision="f32", threads=threads),
                                 runs, warmup, rounds, metric)
        self.gated = gated  # the outputs the quality gate looks at (every output when empty)
        self._reference: Outputs | None = None
        self._folder = tempfile.TemporaryDirectory(prefix="edgeopt-steps-")  # IRs stay while their models are open
        self._sessions: list[OpenVINOSession] = []  # each step's compiled IR, timed by ``finish``

    def __call__(self, label: str, working: WorkingModel) -> None:
        counts = self._counts(working)
        fmt = FORMATS[REFERENCE]
        xml = fmt.main_file(Path(self._folder.name), f"step{len(self._sessions)}")
        fmt.write(self._openvino(working), xml, working.float_weights_fp16)
        size = sum(f.stat().st_size for f in fmt.files(xml))
        session = OpenVINOSession(xml, self.report.settings)
        outputs = all_outputs(session.infer, self.data, self.source.output_names)
        if self._reference is None:
            self._reference = self._original_outputs(outputs)
        quality = measure_outputs(label, outputs, self.data.labels, self._reference, gated=self.gated,
                                  metric=self.report.metric, targets=self.data.targets)
        self._sessions.append(session)
        self.report.rows.append(StepRow(label, *counts, size, working.precision, quality.top1,
                                        quality.fidelity.cosine, quality.metric.value if quality.metric else None,
                                        p50_ms=float("nan")))

    def finish(self) -> StepReport:
        """Time every step's model in interleaved rounds, fill in the rows and release the compiled models."""
        sessions, self._sessions = self._sessions, []
        feeds = random_feeds(sessions[0].static_inputs) if sessions else {}
        timings = time_interleaved(sessions, feeds, self.report.rounds, -(-self.report.runs // self.report.rounds),
                                   self.report.warmup)
        self.report.rows = [replace(row, p50_ms=latency_stats(times).p50_ms)
                            for row, times in zip(self.report.rows, timings)]
        del sessions
        self.close()
        return self.report

    def close(self) -> None:
        """Release the compiled models and remove their IRs (also when the run fails before ``finish``)."""
        self._sessions.clear()
        self._folder.cleanup()

    def _counts(self, working: WorkingModel) -> tuple[int | None, int | None]:
        """Params and MACs of the current torch module; steps past conversion keep the architecture's counts."""
        from torch import nn

        module = working.torch_module
        if isinstance(module, nn.Module) and not working.converted() and working.precision == "fp32":
            from edgeopt.metrics import count_params_and_macs

            return count_params_and_macs(module, self.source.example_input)
        previous = self.report.rows[-1] if self.report.rows else None
        return (previous.params, previous.macs) if previous else (None, None)

    def _openvino(self, working: WorkingModel):
        if working.ov_model is not None:
            return working.ov_model
        if working.torch_module is not None:
            return to_openvino(working.torch_module, self.source.example_input, self.source.input_names)
        return self.source.openvino_model()

    def _original_outputs(self, first_row_outputs: Outputs) -> Outputs:
        """The original in its own framework (PyTorch) where it has one, else the first row's outputs."""
        if self.source.kind == "torch":
            return all_outputs(torch_predictor(self.source.torch_module, self.source.input_names), self.data,
                               self.source.output_names)
        return first_row_outputs

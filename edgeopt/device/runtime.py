"""Run a saved model (OpenVINO IR or ONNX) in its runtime with pinned, reportable settings.

Lean module: imports numpy and, lazily, only the runtime the model needs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgeopt.device.formats import FILE_FORMATS, file_format
from edgeopt.errors import BadInputError, first_line

PRECISIONS = ("f32", "bf16", "f16")
RECORDED_SHAPES = "edgeopt.input_shapes"  # ONNX metadata: the sizes edgeopt calibrated a dynamic input at


SINGLE_INPUT = "input"  # a PyTorch model's single input where forward() names none; once, every factory's


def one_input_alias(names: list[str], given: dict) -> dict:
    """``given`` (values by input name) with ``SINGLE_INPUT`` read as a one-input model's input, whatever it is
    named (the name edgeopt gave every PyTorch factory's single tensor before it took ``forward()``'s); where
    ``given`` names the input itself too (a profile's ``input`` merged with ``--input-shape x=...``), that wins."""
    if len(names) == 1 and SINGLE_INPUT in given and names[0] != SINGLE_INPUT:
        rest = {name: value for name, value in given.items() if name != SINGLE_INPUT}
        return {names[0]: given[SINGLE_INPUT], **rest}
    return given


def onnx_recorded_shapes(metadata: dict[str, str]) -> dict[str, list[int]]:
    """The sizes an ONNX file's metadata (key -> value) records for its dynamic inputs (edgeopt's files), or {}."""
    recorded = metadata.get(RECORDED_SHAPES)
    return json.loads(recorded) if recorded else {}


def openvino_recorded_shapes(model) -> dict[str, list[int]]:
    """The sizes an OpenVINO model records for its dynamic inputs, or {}: edgeopt's IR, and an ONNX file's
    metadata as OpenVINO's frontend keeps it."""
    key = ["framework", RECORDED_SHAPES]
    return json.loads(model.get_rt_info(key).astype(str)) if model.has_rt_info(key) else {}


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (None for a dynamic dimension) and numpy dtype of a model input or output, and the axis
    that holds the batch (``None``: none, as for a rank-0 scalar such as a sample rate)."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str
    batch_axis: int | None = 0

    @property
    def is_static(self) -> bool:
        return all(d is not None for d in self.shape)

    @property
    def batch_dim(self) -> int | None:
        """The batch axis when the tensor has one (never for a rank-0 tensor)."""
        return self.batch_axis if self.batch_axis is not None and self.batch_axis < len(self.shape) else None


@dataclass(frozen=True)
class RuntimeSettings:
    """How a model is compiled: every latency figure is reported together with these."""

    runtime: str = "openvino"
    threads: int | None = None
    streams: int | None = 1
    performance_hint: str | None = "LATENCY"
    inference_precision: str | None = "f32"
    device: str = "CPU"
    spinning: bool | None = None  # ONNX Runtime's intra-op threads spin while they wait (its default, None) or not

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise BadInputError(f"unknown runtime '{self.runtime}' (expected one of {', '.join(RUNTIMES)})")
        if self.spinning is not None and self.runtime != "onnxruntime":
            raise BadInputError(f"spinning is an ONNX Runtime setting; runtime '{self.runtime}' has none")
        if self.inference_precision is not None and self.inference_precision not in PRECISIONS:
            raise BadInputError(
                f"unknown inference precision '{self.inference_precision}' (expected one of {', '.join(PRECISIONS)})"
            )

    def describe(self) -> dict:
        described = asdict(self)
        if self.spinning is None:  # ONNX Runtime's default: left out, as bundles and readers before it had it
            del described["spinning"]
        return described


def runtime_for(path: str | Path) -> str:
    """The runtime that natively loads ``path`` (``edgeopt.device.formats``)."""
    return file_format(path).runtime


def runtime_version(runtime: str) -> str:
    return SESSIONS[runtime].version()


class Session:
    """A compiled model ready for inference; ``infer`` takes a dict of numpy arrays by input name.

    A runtime is one subclass, listed in ``SESSIONS``; ``opens`` names the file formats it reads."""

    label: str
    opens: tuple[str, ...]
    precision_hint: bool  # whether the runtime takes an inference precision (else it computes in the model's)

    @staticmethod
    def version() -> str:  # pragma: no cover - interface
        raise NotImplementedError

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    settings: RuntimeSettings
    compile_seconds: float
    bound_outputs: bool = True  # ``bind`` runs with its outputs bound (else a plain run: a copy per call)
    recorded_shapes: dict[str, list[int]]  # the sizes the file records for its dynamic inputs (edgeopt's), or {}

    @property
    def static_inputs(self) -> list[TensorSpec]:
        """The inputs at static shapes: a dynamic one at the sizes the file records (edgeopt's artifacts)."""
        return [TensorSpec(s.name, tuple(self.recorded_shapes[s.name]), s.dtype, s.batch_axis)
                if not s.is_static and s.name in self.recorded_shapes else s for s in self.inputs]

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:  # pragma: no cover - interface
        raise NotImplementedError

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:  # pragma: no cover - interface
        """Bind ``feeds`` once and return a call that runs one inference on them, leaving the outputs in the
        runtime's buffers: what latency measurement times (as ``benchmark_app`` does), without the per-call
        conversion of Python inputs and copy of outputs that ``infer`` adds."""
        raise NotImplementedError

    def effective_settings(self) -> dict:
        """Settings as the runtime reports them after compilation (not just what was asked)."""
        return self.settings.describe()

    def last_runtime_ms(self) -> float | None:
        """The runtime's own time for the last inference, where it reports one (OpenVINO does)."""
        return None

    def kernels(self) -> list[str]:
        """The kernel types the runtime chose (evidence of the ISA and precision used), where it reports them."""
        return []


_OV_TYPES = {"f32": "float32", "f16": "float16", "i64": "int64", "i32": "int32", "u8": "uint8", "i8": "int8",
             "boolean": "bool", "f64": "float64"}
_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(uint8)": "uint8", "tensor(int8)": "int8", "tensor(bool)": "bool",
              "tensor(double)": "float64"}


class OpenVINOSession(Session):
    label = "OpenVINO"
    opens = ("openvino", "onnx")  # edgeopt.device.formats names this runtime reads
    precision_hint = True

    @staticmethod
    def version() -> str:
        import openvino as ov

        return ov.get_version()

    def __init__(self, path: Path, settings: RuntimeSettings, shapes: dict[str, list[int]] | None = None):
        import openvino as ov

        self.settings = settings
        config: dict = {}
        if settings.performance_hint:
            config["PERFORMANCE_HINT"] = settings.performance_hint
        if settings.threads:
            config["INFERENCE_NUM_THREADS"] = int(settings.threads)
        if settings.streams:
            config["NUM_STREAMS"] = int(settings.streams)
        if settings.inference_precision:
            config["INFERENCE_PRECISION_HINT"] = settings.inference_precision
        self._core, self._config, self._path = ov.Core(), config, path
        start = time.perf_counter()
        try:
            model = self._core.read_model(str(path))
        except RuntimeError as exc:
            raise BadInputError(f"{path}: OpenVINO cannot load this model ({first_line(exc)})") from exc
        # names as the file has them: compiling can merge a neighbour's tensor names into a port's (GPT-2's
        # input read back as '55'), while the ports' order, shapes and types are the file's
        self.inputs = [_ov_spec(port) for port in model.inputs]
        self.outputs = [_ov_spec(port) for port in model.outputs]
        self.recorded_shapes = openvino_recorded_shapes(model)
        self._model = model if any(None in spec.shape for spec in self.inputs) else None  # to compile again
        self._compile(model, _static_sizes(self.inputs, {**self.recorded_shapes, **(shapes or {})}))
        self.compile_seconds = time.perf_counter() - start

    def _compile(self, model, sizes: dict[str, list[int]]) -> None:
        """Compile ``model`` with its dynamic inputs reshaped to ``sizes`` (static, as a deployment at known
        sizes compiles it: a dynamic compile measured 1.2-1.4x slower); those without a size stay dynamic."""
        try:
            if sizes:
                model.reshape({port: sizes[port.get_any_name()] for port in model.inputs
                               if port.get_any_name() in sizes})
            self._compiled = self._core.compile_model(model, self.settings.device, self._config)
        except Exception as exc:  # OpenVINO raises its own exception types for a shape it cannot take
            at = f" at input shapes {format_sizes(sizes)}" if sizes else ""
            raise BadInputError(f"{self._path}: OpenVINO cannot load this model{at} ({first_line(exc)})") from exc
        self.compiled_shapes = sizes
        self._request = self._compiled.create_infer_request()

    def _fit(self, feeds: dict[str, np.ndarray]) -> None:
        """Compile again where the feeds give every dynamic input sizes it takes, other than those it was compiled
        at (feeds that do not fit are left to the runtime to refuse)."""
        if self._model is None:
            return
        sizes = _static_sizes(self.inputs, {name: list(np.shape(value)) for name, value in feeds.items()})
        if len(sizes) == sum(None in spec.shape for spec in self.inputs) and sizes != self.compiled_shapes:
            self._compile(self._model, sizes)

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self._fit(feeds)
        result = self._request.infer({name: contiguous(value) for name, value in feeds.items()})
        return [np.array(result[port]) for port in self._compiled.outputs]

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        import openvino as ov

        self._fit(feeds)
        self._bound = [contiguous(feeds[spec.name]) for spec in self.inputs]  # kept alive: shared memory
        for index, value in enumerate(self._bound):
            self._request.set_input_tensor(index, ov.Tensor(value, shared_memory=True))
        request = self._request
        return lambda: request.infer(share_outputs=True)  # start_async + wait measured ~10 µs slower

    def last_runtime_ms(self) -> float | None:
        return self._request.latency

    def kernels(self) -> list[str]:
        """OpenVINO's executed kernel types (e.g. ``brgconv_avx512_I8``)."""
        kinds = set()
        for op in self._compiled.get_runtime_model().get_ops():
            info = op.get_rt_info()
            if "primitiveType" in info:
                kinds.add(info["primitiveType"].astype(str))
        return sorted(k for k in kinds if not k.startswith("unknown"))

    def effective_settings(self) -> dict:
        described = self.settings.describe()
        for key, prop in (("threads", "INFERENCE_NUM_THREADS"), ("streams", "NUM_STREAMS"),
                          ("inference_precision", "INFERENCE_PRECISION_HINT"), ("performance_hint", "PERFORMANCE_HINT")):
            value = self._compiled.get_property(prop)
            described[key] = value.to_string() if hasattr(value, "to_string") else str(value)
        if self.compiled_shapes:
            described["compiled_at"] = dict(self.compiled_shapes)  # the file's dynamic inputs, reshaped to these
        return described


def _static_sizes(inputs: list[TensorSpec], sizes: dict[str, list[int]]) -> dict[str, list[int]]:
    """Input name -> the static shape a dynamic input takes from ``sizes`` (given over recorded), where they fit
    it (those that do not are the caller's to refuse, with the shapes it was given)."""
    return {spec.name: list(sizes[spec.name]) for spec in inputs
            if None in spec.shape and spec.name in sizes and len(sizes[spec.name]) == len(spec.shape)
            and all(d is None or d == g for d, g in zip(spec.shape, sizes[spec.name]))}


class OnnxRuntimeSession(Session):
    label = "ONNX Runtime"
    opens = ("onnx",)
    precision_hint = False

    @staticmethod
    def version() -> str:
        import onnxruntime as ort

        return ort.__version__

    def __init__(self, path: Path, settings: RuntimeSettings, shapes: dict[str, list[int]] | None = None):
        """``shapes`` is not needed: ONNX Runtime runs a dynamic input at each call's size at no extra cost."""
        import onnxruntime as ort

        self.settings = settings
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.inter_op_num_threads = 1
        if settings.threads:
            options.intra_op_num_threads = int(settings.threads)
        if settings.spinning is not None:
            options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.spinning else "0")
        options.log_severity_level = 3
        start = time.perf_counter()
        try:
            self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own exception types from C++
            raise BadInputError(f"{path}: ONNX Runtime cannot load this model ({first_line(exc)})") from exc
        self.compile_seconds = time.perf_counter() - start
        self.inputs = [TensorSpec(i.name, _ort_shape(i.shape), _ORT_TYPES.get(i.type, i.type))
                       for i in self._session.get_inputs()]
        self.outputs = [TensorSpec(o.name, _ort_shape(o.shape), _ORT_TYPES.get(o.type, o.type))
                        for o in self._session.get_outputs()]
        self.recorded_shapes = onnx_recorded_shapes(self._session.get_modelmeta().custom_metadata_map)

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self._session.run(None, feeds)

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        binding = self._session.io_binding()
        self._bound = [contiguous(feeds[spec.name]) for spec in self.inputs]  # kept alive while bound
        for spec, value in zip(self.inputs, self._bound):
            binding.bind_cpu_input(spec.name, value)
        for spec in self.outputs:
            binding.bind_output(spec.name, "cpu")
        session = self._session
        try:
            for _ in range(2):  # the second run reuses the outputs the first allocated, and checks them
                session.run_with_iobinding(binding)
        except Exception:  # noqa: BLE001 - ONNX Runtime raises RuntimeError from C++
            # a file whose declared output shape its graph does not compute (ddddocr's OCR model: [1, seqlen]
            # declared, [20, 1, 8210] computed) runs with a warning, but not through a binding
            feeds = {spec.name: value for spec, value in zip(self.inputs, self._bound)}
            self.bound_outputs = False
            return lambda: session.run(None, feeds)
        return lambda: session.run_with_iobinding(binding)

    def effective_settings(self) -> dict:
        described = self.settings.describe()
        # ONNX Runtime's CPU provider computes in the model's own precision; there is no precision hint.
        described["inference_precision"] = "model precision (ONNX Runtime CPU has no precision hint)"
        described["performance_hint"] = None
        described["streams"] = 1
        described["spinning"] = self.settings.spinning is not False  # ONNX Runtime's default spins
        return described


def open_session(path: str | Path, settings: RuntimeSettings | None = None,
                 shapes: dict[str, list[int]] | None = None) -> Session:
    """Load and compile ``path`` in the runtime ``settings`` names (default: the file's native runtime);
    ``shapes`` (input name -> sizes) for its dynamic inputs, over the sizes the file records, where the runtime
    compiles for a size (OpenVINO)."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no such model file")
    fmt = file_format(path)
    if settings is None:
        settings = RuntimeSettings(runtime=fmt.runtime)
    session_class = SESSIONS[settings.runtime]
    if fmt.name not in session_class.opens:
        needed = " or ".join(FILE_FORMATS[name].suffix for name in session_class.opens)
        raise BadInputError(f"{path}: {session_class.label} needs an {needed} file")
    for companion in fmt.files(path)[1:]:
        if not companion.is_file():
            raise BadInputError(f"{path}: the weights file {companion.name} is missing")
    return session_class(path, settings, shapes)


SESSIONS: dict[str, type[Session]] = {"openvino": OpenVINOSession, "onnxruntime": OnnxRuntimeSession}
RUNTIMES = tuple(SESSIONS)


def random_feeds(inputs: list[TensorSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random inputs matching static input specs (used for latency measurement)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        if not spec.is_static:
            raise BadInputError(
                f"input '{spec.name}' has a dynamic shape {format_shape(spec.shape)}; give a static shape"
            )
        if np.issubdtype(np.dtype(spec.dtype), np.integer):
            feeds[spec.name] = rng.integers(0, 2, size=spec.shape).astype(spec.dtype)
        else:
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    return feeds


def contiguous(value) -> np.ndarray:
    """``value`` as a C-contiguous array of its own rank (``np.ascontiguousarray`` turns a rank-0 array into
    shape (1,), which a runtime then refuses for a scalar input)."""
    return np.require(value, requirements="C")


def format_shape(shape: tuple[int | None, ...]) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def format_sizes(shapes: dict[str, list[int]]) -> str:
    """Input sizes as messages and reports write them: ``x=1,3,48,320, y=1,4``."""
    return ", ".join(f"{name}={','.join(map(str, shape))}" for name, shape in shapes.items())


def _ov_spec(port) -> TensorSpec:
    shape = tuple(None if d.is_dynamic else d.get_length() for d in port.get_partial_shape())
    dtype = _OV_TYPES.get(port.get_element_type().get_type_name(), port.get_element_type().get_type_name())
    name = port.get_any_name() if port.get_names() else f"{port.get_node().get_friendly_name()}:{port.get_index()}"
    return TensorSpec(name, shape, dtype)


def _ort_shape(shape) -> tuple[int | None, ...]:
    return tuple(d if isinstance(d, int) else None for d in shape)

"""Device profiles: one TOML file per device under ``targets/``, checked against a strict schema.

A profile::

    description = "Raspberry Pi 4 Model B, 4 GB"
    extends = "base-arm64"          # optional: inherit every table, override key by key

    [device]                        # facts about the hardware; decide whether this host IS the device
    cpu = "Broadcom BCM2711, 4x Cortex-A72 @ 1.8 GHz"
    arch = "aarch64"
    cores = 4
    memory_mb = 4096
    isa = ["asimd"]
    cpu_match = ["Cortex-A72"]      # substrings of the host's CPU model that identify the device

    [runtime]                       # how the device runs models (edgeopt.device.runtime.RuntimeSettings)
    name = "openvino"
    threads = 4
    streams = 1
    performance_hint = "LATENCY"
    inference_precision = "f32"
    spinning = false                # optional, ONNX Runtime only: idle threads wait without spinning (default: spin)

    [budgets]                       # edgeopt.device.budgets.Budgets: every key required
    max_file_mb = 64
    ...

    [model]
    precisions = ["int8", "fp32"]   # model precisions, by preference (compress uses the first)
    input_shapes = { input = [1, 3, 224, 224] }   # optional: fills dynamic dimensions
    batch_axes = { state = 1 }      # optional: the batch axis of inputs whose model does not say ("none": none)
    objective = "p50_ms"            # optional: what `optimize` minimises (p50/p95/p99_ms, file_mb, peak_rss_mb)

    [quality]                       # optional: the task metric the quality gate judges (docs/metrics.md)
    metric = "metrics.py:f1"        # file.py:function, relative to this profile; --metric wins
    max_drop = 0.02                 # optional: allowed drop in the metric's units (or max_rel_drop, a fraction)

``abstract = true`` marks a base meant only to be extended. Profiles are looked up in ``$EDGEOPT_TARGETS``
(folders separated by ``os.pathsep``), then in the repository's ``targets/`` folder, then in
``<prefix>/share/edgeopt/targets`` (where a wheel installs them).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from edgeopt.device.budgets import BUDGET_FIELDS, SPREAD_BUDGETS, Budgets, check_budgets, mark_emulated
from edgeopt.device.host import HostInfo, not_the_device
from edgeopt.device.runtime import PRECISIONS, RUNTIMES, RuntimeSettings
from edgeopt.device.task_metric import MetricSpec
from edgeopt.device.validate import isa_cap_note
from edgeopt.errors import BadInputError
from edgeopt.tomlio import read_toml

MODEL_PRECISIONS = ("int8", "fp16", "fp32")
OBJECTIVES = ("p50_ms", "p95_ms", "p99_ms", "file_mb", "peak_rss_mb")  # what `optimize` minimises
HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
ARCHES = ("x86_64", "aarch64")

# key -> (type or tuple of types, description) per table; "" is the top level
_SCHEMA: dict[str, dict[str, tuple]] = {
    "": {"description": (str,), "extends": (str,), "abstract": (bool,)},
    "device": {"name": (str,), "cpu": (str,), "arch": (str,), "cores": (int,), "memory_mb": (int,),
               "isa": (list,), "cpu_match": (list,)},
    "runtime": {"name": (str,), "threads": (int,), "streams": (int,), "performance_hint": (str,),
                "inference_precision": (str,), "spinning": (bool,)},
    "budgets": {key: (int, float) for key in BUDGET_FIELDS},
    "model": {"precisions": (list,), "input_shapes": (dict,), "batch_axes": (dict,), "objective": (str,)},
    "quality": {"metric": (str,), "max_drop": (int, float), "max_rel_drop": (int, float)},
}
_REQUIRED = ("description", "device.name", "device.cpu", "device.arch", "device.cores", "device.memory_mb",
             "runtime.name", "runtime.threads", "runtime.inference_precision", "model.precisions",
             *(f"budgets.{key}" for key in BUDGET_FIELDS))


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    cpu: str
    arch: str
    cores: int
    memory_mb: int
    isa: tuple[str, ...] = ()
    cpu_match: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    device: DeviceInfo
    settings: RuntimeSettings
    budgets: Budgets
    precisions: tuple[str, ...]
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batch_axes: dict[str, int | None] = field(default_factory=dict)  # by input name, where the model does not say
    objective: str = "p50_ms"  # what `edgeopt optimize` minimises among passing candidates
    metric: MetricSpec | None = None  # the task metric the quality gate judges ([quality])
    source: Path | None = None
    extends: tuple[str, ...] = ()  # the chain of bases, nearest first

    def input_shapes_from(self, given: dict | None) -> str:
        """What gave the input shapes merged over this profile's (``given``: the command line's), as an error
        names it: a profile's shape for an input the model lacks is not a mistake on the command line."""
        if not self.input_shapes:
            return "--input-shape"
        own = f"target {self.name}'s [model] input_shapes"
        return f"--input-shape or {own}" if given else own

    def is_host(self, host: HostInfo) -> bool:
        """True when ``host`` is this device: same architecture, a CPU model that matches, enough CPUs."""
        return not not_the_device(asdict(self.device), host.machine, host.cpu_model, host.usable_cpus)

    def describe(self) -> dict:
        return {"name": self.name, "description": self.description, "device": asdict(self.device),
                "runtime": self.settings.describe(), "budgets": self.budgets.describe(),
                "precisions": list(self.precisions), "objective": self.objective,
                "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
                "batch_axes": dict(self.batch_axes), **({"metric": self.metric.describe()} if self.metric else {}),
                "source": str(self.source) if self.source else None, "extends": list(self.extends)}


@dataclass(frozen=True)
class Measuring:
    """How an artifact is measured on a device (or emulated here): at least ``runs`` timed inferences after
    ``warmup`` untimed ones, and timing for at least ``min_seconds``."""

    runs: int = 300
    warmup: int = 20
    min_seconds: float = 2.0

    def describe(self) -> dict:
        return {"runs": self.runs, "warmup": self.warmup, "min_seconds": self.min_seconds, "batch": 1}


@dataclass(frozen=True)
class Emulation:
    """How this host stands in for a device it is not: settings to use, CPUs to pin, ISA cap, and the note."""

    settings: RuntimeSettings
    cpus: tuple[int, ...] | None
    max_isa: str | None
    note: str
    cross_isa: bool = False  # another architecture: even memory figures are the host runtime's, not the device's


def search_path() -> list[Path]:
    """``$EDGEOPT_TARGETS`` folders, then the built-in ones. An entry that is a file is refused; a missing
    folder is skipped with a one-line warning (once per process)."""
    env = []
    for entry in (p for p in os.environ.get("EDGEOPT_TARGETS", "").split(os.pathsep) if p):
        path = Path(entry)
        if path.is_dir():
            env.append(path)
        elif path.exists():
            raise BadInputError(f"EDGEOPT_TARGETS: '{entry}' is not a folder (it lists folders of profiles, "
                                f"separated by '{os.pathsep}')")
        elif entry not in _WARNED:
            _WARNED.add(entry)
            print(f"edgeopt: warning: EDGEOPT_TARGETS folder '{entry}' does not exist; skipped", file=sys.stderr)
    return [*env, Path(__file__).resolve().parents[1] / "targets", Path(sys.prefix) / "share" / "edgeopt" / "targets"]


_WARNED: set[str] = set()


def load_target(name_or_path: str | os.PathLike) -> Target:
    """Load a profile by name (looked up in ``search_path()``) or by path; resolve ``extends``; check it."""
    path = _locate(str(name_or_path))
    raw, chain = _resolve(path, ())
    if raw.get("abstract"):
        raise BadInputError(f"{path}: '{path.stem}' is an abstract base profile; use a profile that extends it")
    return _build(path, raw, chain)


def list_targets() -> list[Target]:
    """Every concrete profile on the search path (the first of a name wins), sorted by name."""
    targets = []
    for path in _files().values():
        raw, chain = _resolve(path, ())
        if not raw.get("abstract"):
            targets.append(_build(path, raw, chain))
    return targets


def _files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in search_path():
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def _names() -> list[str]:
    """Names of the concrete profiles, without checking them (for messages)."""
    names = []
    for name, path in _files().items():
        try:
            if not tomllib.loads(path.read_text(encoding="utf-8")).get("abstract"):
                names.append(name)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            names.append(name)
    return names


def plan_emulation(target: Target, host: HostInfo) -> Emulation | None:
    """``None`` when this host is the device; otherwise how to emulate it here, and the note saying so."""
    if target.is_host(host):
        return None
    settings, notes = target.settings, []
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(host.usable_cpus))
    usable = usable[:host.usable_cpus]
    wanted = settings.threads or target.device.cores
    cpus = tuple(usable[:min(target.device.cores, len(usable))])
    threads = min(wanted, len(cpus))
    if threads < wanted:
        limit = (f"this host has {len(usable)} CPUs" if len(usable) < wanted
                 else f"the device has {target.device.cores} cores, so {len(cpus)} CPUs are pinned")
        notes.append(f"the profile runs {wanted} threads but {limit}: latency reads higher than {wanted} threads "
                     f"would give here")
    settings = RuntimeSettings(**(settings.describe() | {"threads": threads}))
    max_isa = None
    if target.device.arch != host.machine:
        notes.append(f"the device is {target.device.arch}, this host {host.machine}: different kernels, "
                     f"latency is indicative only")
    elif target.device.arch == "x86_64" and settings.runtime == "openvino":
        max_isa = onednn_isa(target.device.isa)
        notes.append(isa_cap_note(max_isa).removeprefix("; "))
    elif target.device.arch == "x86_64":
        notes.append("ISA not capped (ONNX Runtime has no switch for it)")
    span = f"CPU {cpus[0]}" if len(cpus) == 1 else f"CPUs {','.join(map(str, cpus))}"
    note = (f"emulated on {socket.gethostname()} ({host.cpu_model}): {threads} threads pinned to {span}"
            + "".join(f"; {n}" for n in notes) + f" — the profiled device is {target.device.name}")
    return Emulation(settings, cpus, max_isa, note, cross_isa=target.device.arch != host.machine)


def onednn_isa(isa: tuple[str, ...]) -> str:
    """The highest oneDNN ISA level (``ONEDNN_MAX_CPU_ISA``) an x86 device with these CPU flags has."""
    flags = set(isa)
    for level, needs in (("AVX512_CORE_AMX", {"amx_tile", "amx_int8", "amx_bf16"}),
                         ("AVX512_CORE_BF16", {"avx512f", "avx512_vnni", "avx512_bf16"}),
                         ("AVX512_CORE_VNNI", {"avx512f", "avx512_vnni"}), ("AVX512_CORE", {"avx512f"}),
                         ("AVX2_VNNI", {"avx2", "avx_vnni"}), ("AVX2", {"avx2"})):
        if needs <= flags:
            return level
    return "SSE41"


def _locate(text: str) -> Path:
    if text.endswith(".toml") or os.sep in text or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise BadInputError(f"{path}: no such target profile")
        return path
    for folder in search_path():
        if (folder / f"{text}.toml").is_file():
            return folder / f"{text}.toml"
    known = ", ".join(_names()) or "none"
    raise BadInputError(f"unknown target '{text}' (known: {known}; or give a .toml path)")


_RUNTIME_OWN = ("spinning",)  # [runtime] keys of one runtime only: a profile that switches runtime drops them


def _resolve(path: Path, seen: tuple[Path, ...]) -> tuple[dict, tuple[str, ...]]:
    """The profile's tables merged over its bases' (deep, key by key), and the chain of base names."""
    raw = _read(path)
    if path.resolve() in seen:
        raise BadInputError(f"{path}: 'extends' makes a cycle ({' → '.join(p.stem for p in seen)} → {path.stem})")
    base_name = raw.get("extends")
    if base_name is None:
        return raw, ()
    sibling = path.parent / f"{base_name}.toml"
    try:
        base_path = sibling if sibling.is_file() else _locate(base_name)
    except BadInputError:
        raise BadInputError(f"{path}: extends: no base profile named '{base_name}'") from None
    base, chain = _resolve(base_path, (*seen, path.resolve()))
    runtime, base_runtime = raw.get("runtime", {}), base.get("runtime", {})
    if runtime.get("name", base_runtime.get("name")) != base_runtime.get("name"):  # another runtime: the base's
        base = base | {"runtime": {k: v for k, v in base_runtime.items() if k not in _RUNTIME_OWN}}  # own go
    merged = {k: (base.get(k, {}) | v if isinstance(v, dict) else v) for k, v in raw.items()}
    merged = base | merged
    merged.pop("abstract", None)
    if raw.get("abstract"):
        merged["abstract"] = True
    return merged, (base_name, *chain)


def _read(path: Path) -> dict:
    raw = read_toml(path)
    for key, value in raw.items():
        if key in _SCHEMA and key:
            if not isinstance(value, dict):
                raise BadInputError(f"{path}: '{key}' must be a table ([{key}]), got {value!r}")
            for inner, inner_value in value.items():
                _check_key(path, key, inner, inner_value)
        else:
            _check_key(path, "", key, value)
    return raw


def _check_key(path: Path, table: str, key: str, value) -> None:
    dotted = f"{table}.{key}" if table else key
    schema = _SCHEMA[table]
    if key not in schema:
        known = ", ".join(f"{table}.{k}" if table else k for k in schema)
        if not table:
            known += ", [" + "], [".join(t for t in _SCHEMA if t) + "]"
        raise BadInputError(f"{path}: unknown key '{dotted}' (known: {known})")
    types = schema[key]
    if isinstance(value, float) and not math.isfinite(value):
        raise BadInputError(f"{path}: '{dotted}' must be a finite number, got {value!r}")
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        expected = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "an array",
                    dict: "a table"}[types[-1]]
        raise BadInputError(f"{path}: '{dotted}' must be {expected}, got {value!r}")


def _build(path: Path, raw: dict, chain: tuple[str, ...]) -> Target:
    for dotted in _REQUIRED:
        table, _, key = dotted.rpartition(".")
        if key not in (raw.get(table, {}) if table else raw):
            where = f" (not set here nor in {', '.join(chain)})" if chain else ""
            kind = "budget" if table == "budgets" else "key"
            raise BadInputError(f"{path}: missing {kind} '{dotted}'{where}")
    device, runtime, model = raw["device"], raw["runtime"], raw["model"]
    _choice(path, "device.arch", device["arch"], ARCHES)
    _choice(path, "runtime.name", runtime["name"], RUNTIMES)
    _choice(path, "runtime.inference_precision", runtime["inference_precision"], PRECISIONS)
    if "spinning" in runtime and runtime["name"] != "onnxruntime":
        raise BadInputError(f"{path}: 'runtime.spinning' is an ONNX Runtime setting (ONNX Runtime only); this "
                            f"profile's runtime.name is '{runtime['name']}'")
    if "performance_hint" in runtime:
        _choice(path, "runtime.performance_hint", runtime["performance_hint"], HINTS)
    for key in ("device.cores", "device.memory_mb", "runtime.threads", "runtime.streams"):
        table, name = key.split(".")
        if name in raw[table] and raw[table][name] < 1:
            raise BadInputError(f"{path}: '{key}' must be at least 1, got {raw[table][name]}")
    precisions = _strings(path, "model.precisions", model["precisions"])
    if not precisions:
        raise BadInputError(f"{path}: 'model.precisions' must name at least one of {', '.join(MODEL_PRECISIONS)}")
    for precision in precisions:
        _choice(path, "model.precisions", precision, MODEL_PRECISIONS)
    objective = model.get("objective", "p50_ms")
    _choice(path, "model.objective", objective, OBJECTIVES)
    settings = RuntimeSettings(runtime=runtime["name"], threads=runtime["threads"], streams=runtime.get("streams", 1),
                               performance_hint=runtime.get("performance_hint", "LATENCY"),
                               inference_precision=runtime["inference_precision"], spinning=runtime.get("spinning"))
    return Target(
        name=path.stem, description=raw["description"],
        device=DeviceInfo(name=device["name"], cpu=device["cpu"], arch=device["arch"], cores=device["cores"],
                          memory_mb=device["memory_mb"], isa=_strings(path, "device.isa", device.get("isa", [])),
                          cpu_match=_strings(path, "device.cpu_match", device.get("cpu_match", []))),
        settings=settings, budgets=Budgets.from_dict(raw["budgets"], source=f"{path}: budgets"),
        precisions=precisions, input_shapes=_shapes(path, model.get("input_shapes", {})),
        batch_axes=_batch_axes(path, model.get("batch_axes", {})), objective=objective,
        metric=_metric(path, raw.get("quality", {})), source=path, extends=chain,
    )


def _metric(path: Path, quality: dict) -> MetricSpec | None:
    if "metric" not in quality:
        if quality:
            raise BadInputError(f"{path}: [quality] {', '.join(sorted(quality))} need(s) 'quality.metric'")
        return None
    from edgeopt.user_metric import load_metric

    try:
        return load_metric(quality["metric"], relative_to=path.parent, max_drop=quality.get("max_drop"),
                           max_rel_drop=quality.get("max_rel_drop"))
    except BadInputError as exc:
        raise BadInputError(f"{path}: quality.metric: {exc}") from None


def _choice(path: Path, key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise BadInputError(f"{path}: '{key}' must be one of {', '.join(allowed)}, got {value!r}")


def _strings(path: Path, key: str, values: list) -> tuple[str, ...]:
    if not all(isinstance(v, str) for v in values):
        raise BadInputError(f"{path}: '{key}' must be an array of strings, got {values!r}")
    return tuple(values)


def _batch_axes(path: Path, table: dict) -> dict[str, int | None]:
    """``name = AXIS`` (a non-negative integer) or ``name = "none"`` per input."""
    axes: dict[str, int | None] = {}
    for name, axis in table.items():
        if axis == "none":
            axes[name] = None
        elif isinstance(axis, int) and not isinstance(axis, bool) and axis >= 0:
            axes[name] = axis
        else:
            raise BadInputError(f"{path}: 'model.batch_axes.{name}' must be a non-negative integer or \"none\", "
                                f"got {axis!r}")
    return axes


def _shapes(path: Path, table: dict) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for name, dims in table.items():
        if not (isinstance(dims, list) and dims and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                        for d in dims)):
            raise BadInputError(f"{path}: 'model.input_shapes.{name}' must be an array of positive integers, "
                                f"got {dims!r}")
        shapes[name] = tuple(dims)
    return shapes


def validate_on(target: Target, model_path: str | os.PathLike, *, measuring: Measuring = Measuring(),
                input_shapes: dict[str, tuple[int, ...]] | None = None, host: HostInfo | None = None):
    """Validate ``model_path`` against ``target``'s budgets with its settings, emulating the device when this
    host is not it (``plan_emulation``); returns a ``ValidationReport``."""
    from edgeopt.device.host import host_info
    from edgeopt.device.validate import validate_artifact

    emulation = plan_emulation(target, host or host_info())

    def measure():
        report = validate_artifact(
            model_path, emulation.settings if emulation else target.settings, target.budgets, runs=measuring.runs,
            warmup=measuring.warmup, min_seconds=measuring.min_seconds,
            emulation_note=emulation.note if emulation else None,
            cpus=emulation.cpus if emulation else None, max_isa=emulation.max_isa if emulation else None,
            input_shapes={**target.input_shapes, **(input_shapes or {})}, target=target.name,
        )
        return replace(report, checks=judge(target.budgets, report.measured(), emulation))

    report = measure()
    if _spread_failed_busy(report):  # the host's own noise, not the model's: measure once more
        again = measure()
        note = "a spread budget failed while the host was busy, so it was measured a second time: " + (
            "it failed again with the host still busy, so it reads UNRELIABLE, not FAIL" if _spread_failed_busy(again)
            else "the second measurement is the one reported")
        report = replace(again, notes=again.notes + [note])
        if _spread_failed_busy(report):
            report = replace(report, checks=mark_unreliable(report.checks))
    return report


def judge(budgets: Budgets, figures: dict, emulation: Emulation | None, *, busy_twice: bool = False) -> list:
    """Check ``figures`` against ``budgets``; when they were measured in emulation, the timing budgets (and, on
    another architecture, the memory budget) are marked emulated with the reason: never a device PASS.
    ``busy_twice``: the figures come from a second measurement on a host busy both times (:func:`validate_on`),
    so a failed spread budget reads UNRELIABLE (:func:`mark_unreliable`)."""
    checks = check_budgets(budgets, figures)
    if emulation is not None:
        checks = mark_emulated(checks, emulation.note, memory=emulation.cross_isa)
    return mark_unreliable(checks) if busy_twice else checks


def mark_unreliable(checks: list) -> list:
    """Failed spread budgets measured twice on a busy host: UNRELIABLE (passing), the host's noise, not the
    model's."""
    return [replace(c, status="unreliable", passed=True,
                    reason="the host was busy both times (load average above its CPU count)")
            if c.name in SPREAD_BUDGETS and not c.passed else c for c in checks]


def _spread_failed_busy(report) -> bool:
    busy = report.host.get("load_average_1min", 0) > report.host.get("usable_cpus", 1)
    return busy and any(c.name in SPREAD_BUDGETS and not c.passed for c in report.checks)


def model_in(path: str | os.PathLike, runtime: str) -> Path:
    """``path`` itself, or the one model file in folder ``path`` that ``runtime`` runs (its native format first)."""
    from edgeopt.device.formats import FILE_FORMATS
    from edgeopt.device.runtime import SESSIONS

    path = Path(path)
    if not path.is_dir():
        return path
    opens = sorted(SESSIONS[runtime].opens, key=lambda name: FILE_FORMATS[name].runtime != runtime)
    suffixes = tuple(FILE_FORMATS[name].suffix for name in opens)
    for suffix in suffixes:
        found = sorted(path.glob(f"*{suffix}"))
        if len(found) == 1:
            return found[0]
        if found:
            raise BadInputError(f"{path}: several {suffix} models ({', '.join(f.name for f in found)}); name one")
    raise BadInputError(f"{path}: no {' or '.join(suffixes)} model for {runtime} in this folder")

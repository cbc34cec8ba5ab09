"""The public API: one call per capability, the same things the command line does (the CLI is a thin layer
over these). Every call takes the device profile as a ``Target``, a profile name or a ``.toml`` path.

    import edgeopt
    result = edgeopt.compress("model.onnx", "calib.npz", out="out/", target="raspberry-pi-4")
    report = edgeopt.validate("out/", target="raspberry-pi-4")
    found = edgeopt.optimize("model.py:build", "calib.npz", "eval.npz", target="digits-tight", out="best/")
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from edgeopt import atomic
from edgeopt.device.golden import load_golden
from edgeopt.device.task_metric import MetricSpec
from edgeopt.device.validate import ValidationReport
from edgeopt.errors import BadInputError
from edgeopt.evaluate import QualityGate
from edgeopt.offline import decline_telemetry
from edgeopt.pipeline import CompressResult, as_target, compress
from edgeopt.targets import Measuring, Target, model_in, validate_on

__all__ = ["compress", "validate", "optimize", "CompressResult"]

decline_telemetry()  # edgeopt.offline: no usage telemetry from the libraries it drives


def validate(artifact: str | Path, target: Target | str | Path, *, measuring: Measuring = Measuring(),
             input_shapes: dict[str, tuple[int, ...]] | None = None, golden: str | Path | None = None,
             metric: MetricSpec | None = None) -> ValidationReport:
    """Measure ``artifact`` (a model file or an ``edgeopt compress`` folder) with the target's settings and check
    it against its budgets (emulating the device when this host is not it). ``golden``: also check it against
    this golden set (the report's ``golden``), with ``metric`` instead of the set's own metric file."""
    from dataclasses import replace

    from edgeopt.packaging import gate_failure

    profile = as_target(target)
    golden_set = load_golden(golden) if golden is not None else None  # a bad golden set fails before measuring
    model = model_in(artifact, profile.settings.runtime)
    failure = gate_failure(Path(artifact), model)
    report = replace(validate_on(profile, model, measuring=measuring, input_shapes=input_shapes),
                     compress_gate=failure)
    if golden_set is None:
        return report
    from edgeopt.golden import check_golden

    return replace(report, golden=check_golden(golden_set, model, profile.settings, metric).describe())


def optimize(model: str | Path, calibration: str | Path, eval_data: str | Path, *, target: Target | str | Path,
             out: str | Path, gate: QualityGate | None = None, objective: str | None = None,
             plan: str | Path | None = None, cache_dir: str | Path | None = None,
             measuring: Measuring = Measuring(), input_shapes: dict | None = None, seed: int = 0,
             progress: Callable | None = None, pool=None, warn: Callable[[str], None] | None = None,
             executor=None, pareto=None):
    """Search the plan for the best artifact ``target`` accepts; write it (when one passes) with report.json,
    report.md, report.html and the figures into ``out`` atomically. Returns the ``OptimizeResult``; its
    ``verdict`` says found / budgets / unbuilt / quality. ``pool``: an ``edgeopt.remote.pool.DevicePool`` that measures the
    candidates on devices; ``warn`` hears the cache's warnings; ``executor`` (``edgeopt.optimization.executor``) runs
    the builds and host measurements (default: here, in order). ``pareto``
    (``edgeopt.optimization.pareto.ParetoSearch``): a multi-objective Optuna search instead of the plan."""
    from edgeopt.optimization.cache import Cache, default_cache_dir
    from edgeopt.optimization.search import search
    from edgeopt.reporting import write_reports

    profile = as_target(target)
    common = dict(gate=gate or QualityGate(), measuring=measuring, objective=objective or profile.objective,
                  cache=Cache(cache_dir or default_cache_dir(), **({"warn": warn} if warn else {})),
                  input_shapes=input_shapes, seed=seed, **({"progress": progress} if progress else {}))
    if pareto is not None:
        from edgeopt.optimization.pareto import search_pareto

        if plan is not None or pool is not None:
            raise BadInputError("the Pareto search takes no plan and measures on this host (no device pool)")
        result = search_pareto(str(model), str(calibration), str(eval_data), profile, settings=pareto, **common)
    else:
        result = search(str(model), str(calibration), str(eval_data), profile, plan=plan, pool=pool,
                        executor=executor, **common)
    with atomic.atomic_dir(out) as tmp:
        if result.chosen:
            result.chosen_files = list(result.chosen.validation["files"])
            for name in result.chosen_files:
                shutil.copy2(result.chosen.artifact.parent / name, tmp / name)
        write_reports(result.describe() | ({"devices": pool.describe()} if pool else {}), tmp)
    return result

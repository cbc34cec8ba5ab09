"""``edgeopt optimize``: search the recipe space for a device profile and keep the best artifact that passes."""

from __future__ import annotations

from pathlib import Path

import click

from edgeopt.cli.gate_options import gate_options, quality_gate
from edgeopt.cli.out_options import force_option, guard_outputs
from edgeopt.errors import BadInputError, BudgetError, QualityGateError
from edgeopt.out_guard import input_bytes
from edgeopt.targets import OBJECTIVES


@click.command()
@click.argument("model")
@click.option("--target", required=True, help="Device profile: a name from `edgeopt targets list` or a .toml path.")
@click.option("--calib", "calibration", required=True, help="Calibration data: .npz, .npy, image folder or file.py:fn.")
@click.option("--eval", "eval_data", required=True, help="Evaluation data for the quality gate (labels: top-1).")
@click.option("--out", required=True, type=click.Path(), help="Output folder: the chosen artifact and the reports "
              "(written atomically).")
@gate_options
@click.option("--objective", type=click.Choice(OBJECTIVES), default=None,
              help="Among candidates that pass, pick the lowest of this figure (near-ties: the smaller file). "
                   "Default: the profile's model.objective, else p50_ms.")
@click.option("--plan", default=None, help="Search plan .toml (default: edgeopt/optimization/plan.toml).")
@click.option("--search", "search_kind", type=click.Choice(("staged", "pareto")), default="staged", show_default=True,
              help="staged: the plan's stages in order; pareto: a multi-objective Optuna search over recipe "
                   "parameters (latency, size, quality), resumable from the cache (pip install 'edgeopt[search]').")
@click.option("--trials", default=None, type=click.IntRange(min=1),
              help="--search pareto: trials in all, stored ones included (default 24).")
@click.option("--sampler", type=click.Choice(("nsga2", "tpe")), default=None,
              help="--search pareto: Optuna's NSGA-II (default) or TPE sampler.")
@click.option("--cache", "cache_dir", default=None, type=click.Path(),
              help="Cache of built candidates and measurements (default: $EDGEOPT_CACHE or ~/.cache/edgeopt).")
@click.option("--runs", default=300, show_default=True, type=click.IntRange(min=1),
              help="Timed inferences per candidate (at least).")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(min=1), help="Untimed inferences first.")
@click.option("--min-seconds", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Keep timing each candidate at least this long.")
@click.option("--input-shape", "input_shapes", multiple=True, help="NAME=D1,D2,... for dynamic inputs.")
@click.option("--device", "device_specs", multiple=True,
              help="Measure every candidate on this device over SSH (devices.toml name or ssh://user@host:port); "
                   "repeat for a pool of devices of the profile, measuring in parallel.")
@click.option("--require-device", is_flag=True,
              help="Exit 5 unless the choice rests on device figures (no emulated verdicts).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "json_out", default=None, help="Write the report as JSON to this file ('-' for stdout).")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@force_option
def optimize(model, target, calibration, eval_data, out, max_drop, min_cosine, min_token_agreement,
             max_perplexity_ratio, objective, plan, search_kind, trials, sampler, cache_dir, runs, warmup, min_seconds,
             input_shapes, device_specs, require_device, seed, json_out, quiet, force, gate_outputs, metric, max_rel_drop):
    """Find the best artifact of MODEL for a device: measure the baseline, then try the plan's stages in order
    (FP16/INT8, accuracy-controlled INT8, weight compression, pruning + distillation) until one meets every
    budget of the profile and the quality gate.

    Exit 0 when one is found, 3 when nothing keeps quality, 4 when nothing meets the budgets, 2 on bad input
    (also when no candidate could be built), 5 when the devices give no figures (or --require-device and only
    emulated ones).
    """
    from edgeopt.api import optimize as run_optimize
    from edgeopt.cli.streams import library_output
    from edgeopt.reporting import tables
    from edgeopt.reporting.console import SearchProgress, emit, print_optimize_result
    from edgeopt.source import parse_input_shapes
    from edgeopt.targets import Measuring, load_target
    from edgeopt.cli.streams import warn
    from edgeopt.device.host import host_info

    pareto = _pareto_settings(search_kind, trials, sampler)
    guard_outputs(out, force, needs_bytes=3 * input_bytes(model), json_out=json_out)
    profile = load_target(target)
    gate = quality_gate(max_drop, min_cosine, min_token_agreement, max_perplexity_ratio, gate_outputs, metric,
                        max_rel_drop)
    pool = None
    if device_specs:
        from edgeopt.optimization.cache import Cache, default_cache_dir
        from edgeopt.remote.pool import DevicePool

        pool = DevicePool(list(device_specs), profile, Cache(cache_dir or default_cache_dir(), warn=warn))
    elif require_device and not profile.is_host(host_info()):
        from edgeopt.errors import DeviceError

        raise DeviceError(f"--require-device: this host is not a {profile.name} and no --device was given, so every "
                          f"timing figure would be emulated")
    with SearchProgress(quiet) as progress, library_output(True):
        result = run_optimize(model, calibration, eval_data, target=profile, out=out, gate=gate, objective=objective,
                              plan=plan, cache_dir=cache_dir, measuring=Measuring(runs, warmup, min_seconds),
                              input_shapes=parse_input_shapes(input_shapes), seed=seed, progress=progress.event,
                              pool=pool, warn=warn, pareto=pareto)
    report = result.describe() | ({"devices": pool.describe()} if pool else {})
    emit(report, lambda: print_optimize_result(report, Path(out)), json_out, quiet)
    where = f"report: {Path(out) / 'report.md'}"
    unmeasured = [c.label for c in result.candidates if (c.skipped or "").startswith("unmeasured")]
    if unmeasured and not result.chosen:
        from edgeopt.errors import DeviceError

        raise DeviceError(f"no candidate chosen and {', '.join(unmeasured)} unmeasured: the device was lost; {where}")
    if result.verdict == "budgets":
        closest = result.closest
        raise BudgetError(f"no candidate meets every budget of {profile.name}; closest: {closest.label} "
                          f"({closest.recipe}) fails {tables.failing_text(closest.describe())}; {where}")
    if result.verdict == "unbuilt":
        from edgeopt.user_code import is_function_spec

        factory = " (a PyTorch factory is called once per candidate)" if is_function_spec(str(model)) else ""
        raise BadInputError(f"no candidate could be built: {' | '.join(result.build_failures)}{factory}; {where}")
    if result.verdict == "quality":
        failed = "; ".join(f"{c.label}: {c.gate_check}" for c in result.candidates if c.gate_passed is False)
        raise QualityGateError(f"no candidate passes the quality gate ({failed or 'none was built'}); {where}")


def _pareto_settings(search_kind: str, trials: int | None, sampler: str | None):
    """``ParetoSearch`` for ``--search pareto`` (else ``None``); its options without it are usage errors."""
    from edgeopt.errors import BadInputError

    if search_kind == "staged":
        if trials is not None or sampler is not None:
            raise BadInputError("--trials and --sampler belong to --search pareto")
        return None
    from edgeopt.optimization.pareto import ParetoSearch

    return ParetoSearch(**{k: v for k, v in (("trials", trials), ("sampler", sampler)) if v is not None})

"""Run a fleet: every (model, target) pair through ``edgeopt.api.optimize`` on an executor, each pair's chosen
artifact bundled, and one matrix report of which pairs pass and why not.

Layout of ``out``: ``MODEL/TARGET/`` (the chosen artifact, report.json/.md/.html, ``bundle.tar.gz`` when one
passed), ``report.json``/``report.md``/``report.html`` (the matrix) and ``junit.xml`` (one test case per pair).
Pairs share one content-addressed cache, so a re-run rebuilds and re-measures only what changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from edgeopt import atomic, jsonio
from edgeopt.errors import BadInputError, BudgetError, DeviceError, EdgeoptError, QualityGateError, first_line
from edgeopt.fleet.slots import overlaps
from edgeopt.fleet.spec import FleetModel, FleetSpec, FleetTarget
from edgeopt.file_digest import sha256_file
from edgeopt.optimization.cache import Cache, digest
from edgeopt.reporting.reports import FleetReport

# worst last: a bug, then bad input, then no device figures, then quality, then budgets
EXIT_SEVERITY = (0, 4, 3, 5, 2, 1)
BUNDLE = "bundle.tar.gz"


@dataclass
class PairResult:
    model: str
    target: str
    devices: list[str]
    verdict: str  # found | budgets | quality | unmeasured | error
    exit_code: int
    why: str  # one line: what was chosen, or why nothing was
    chosen: str | None = None
    recipe: str | None = None
    figures: dict | None = None  # the chosen candidate's: file_bytes, p50_ms, p99_ms, top1_drop, cosine
    chosen_files: dict | None = None  # file name -> sha256
    out: str | None = None  # MODEL/TARGET, relative to the fleet's out
    bundle: str | None = None
    seconds: float = 0.0
    candidates: int = 0  # built or reused
    reused: int = 0  # of those, taken whole from the cache (artifact and measurement)

    @property
    def name(self) -> str:
        return f"{self.model} × {self.target}"

    def describe(self) -> dict:
        return asdict(self)


def worst(codes: list[int]) -> int:
    return max(codes, key=EXIT_SEVERITY.index, default=0)


def run_fleet(spec: FleetSpec, out: Path, *, executor, cache_dir: Path,
              progress=None, warn: Callable[[str], None] | None = None) -> FleetReport:
    """Optimize every pair on ``executor`` (``edgeopt.fleet.executors``); write everything into ``out``
    atomically and return the matrix report (its ``exit_code``: the worst pair's)."""
    from edgeopt.device.host import host_info
    from edgeopt.targets import load_target
    from edgeopt.versions import tool_versions

    started = time.time()
    profiles = {t.name: load_target(t.profile) for t in spec.targets}  # bad profiles fail before any work
    cache = Cache(cache_dir, **({"warn": warn} if warn else {}))
    plans = {m.name: _plan_for(m, cache) for m in spec.models}
    pairs = spec.pairs
    if progress:
        progress.start([f"{m.name} × {t.name}" for m, t in pairs])
    with atomic.atomic_dir(out) as tmp:
        def run_pair(pair: tuple[FleetModel, FleetTarget]) -> PairResult:
            model, target = pair
            result = _run_pair(model, target, profiles[target.name], plans[model.name], spec, tmp, executor,
                               cache, progress, warn)
            if progress:
                progress.pair_done(result)
            return result

        results = executor.map(run_pair, pairs)
        events = sorted(executor.events, key=lambda e: e.start)
        report = FleetReport(
            fleet=str(spec.path), executor=executor.describe(), exit_code=worst([r.exit_code for r in results]),
            models=[m.name for m in spec.models], targets=[t.name for t in spec.targets],
            pairs=[r.describe() for r in results], events=[e.describe() for e in events],
            slot_overlaps=len(overlaps(events)), measuring=spec.measuring.describe(), cache=str(cache.root),
            seconds=round(time.time() - started, 3), host=host_info().describe(), versions=tool_versions())
        write_matrix(report.to_dict(), tmp)
    return report


def write_matrix(report: dict, folder: Path) -> None:
    from edgeopt.reporting import fleet as render

    atomic.write_text(folder / "report.json", jsonio.dumps(report, indent=2))
    atomic.write_text(folder / "report.md", render.markdown(report))
    atomic.write_text(folder / "report.html", render.html(report))
    atomic.write_text(folder / "junit.xml", render.junit(report))


def _run_pair(model: FleetModel, target: FleetTarget, profile, plan: str | None, spec: FleetSpec, root: Path,
              executor, cache: Cache, progress, warn) -> PairResult:
    from edgeopt.api import optimize

    name = f"{model.name} × {target.name}"
    relative = f"{model.name}/{target.name}"
    started = time.time()
    base = PairResult(model.name, target.name, list(target.devices), "error", 1, "")
    try:
        pool = None
        if target.devices:
            from edgeopt.remote.pool import DevicePool

            pool = DevicePool(list(target.devices), profile, cache)
        result = optimize(model.model, model.calibration, model.evaluation, target=profile, out=root / relative,
                          gate=model.gate, objective=model.objective, plan=plan, cache_dir=cache.root,
                          measuring=spec.measuring, input_shapes=model.input_shapes or None, seed=spec.seed,
                          pool=pool, warn=warn, executor=executor.for_pair(name),
                          progress=progress.candidate(name) if progress else None)
    except EdgeoptError as exc:
        base.exit_code, base.why = exc.exit_code, first_line(exc)
        base.verdict = {2: "bad input", 5: "unmeasured"}.get(exc.exit_code, "error")
        base.seconds = round(time.time() - started, 3)
        return base
    except Exception as exc:  # a bug in one pair: the others still run; the fleet exits 1
        base.why = f"internal error: {type(exc).__name__}: {first_line(exc)}"
        base.seconds = round(time.time() - started, 3)
        return base
    base.out, base.seconds = relative, round(time.time() - started, 3)
    base.candidates = sum(1 for c in result.candidates if not c.skipped)
    base.reused = sum(1 for c in result.candidates if not c.skipped and all(c.reused.values()))
    base.verdict, base.exit_code, base.why = _verdict(result)
    chosen = result.chosen
    if chosen is None:
        return base
    base.chosen, base.recipe = chosen.label, chosen.recipe
    base.figures = {"file_bytes": chosen.file_bytes, "p50_ms": chosen.figures.get("p50_ms"),
                    "p99_ms": chosen.figures.get("p99_ms"), "top1_drop": chosen.top1_drop, "cosine": chosen.cosine}
    base.chosen_files = {n: sha256_file(root / relative / n) for n in result.chosen_files}
    try:
        from edgeopt.packaging import package

        package(chosen.artifact.parent, profile, root / relative / BUNDLE, report=chosen.validation)
        base.bundle = f"{relative}/{BUNDLE}"
    except EdgeoptError as exc:
        base.why += f"; not bundled: {first_line(exc)}"
    return base


def _verdict(result) -> tuple[str, int, str]:
    from edgeopt.reporting.tables import failing_text

    if result.chosen:
        c = result.chosen
        return "found", 0, (f"{c.label} ({c.recipe}): {c.file_bytes / 1e6:.3g} MB, p50 "
                            f"{c.figures['p50_ms']:.3g} ms, {c.gate_check}")
    unmeasured = [c.label for c in result.candidates if (c.skipped or "").startswith("unmeasured")]
    if unmeasured:
        return "unmeasured", DeviceError.exit_code, f"device lost: {', '.join(unmeasured)} unmeasured"
    if result.verdict == "budgets":
        c = result.closest
        return "budgets", BudgetError.exit_code, f"closest {c.label} ({c.recipe}) fails {failing_text(c.describe())}"
    if result.verdict == "unbuilt":
        return "bad input", BadInputError.exit_code, f"no candidate could be built: {' | '.join(result.build_failures)}"
    failed = "; ".join(f"{c.label}: {c.gate_check}" for c in result.candidates if c.gate_passed is False)
    return "quality", QualityGateError.exit_code, f"no candidate keeps quality ({failed or 'none was built'})"


def _plan_for(model: FleetModel, cache: Cache) -> str | None:
    """The model's plan file; for a recipe, a one-candidate plan written (content-addressed) into the cache."""
    if model.recipe is None:
        return model.plan
    from edgeopt.recipe import parse_recipe

    recipe = parse_recipe(model.recipe)
    precision = "fp16" if "fp16" in recipe.names else "int8" if recipe.sets_precision else "fp32"
    steps = ", ".join("{ " + ", ".join([f"name = {jsonio.dumps(s.name)}"]
                                       + [f"{k} = {jsonio.dumps(v)}" for k, v in sorted(s.params.items())]) + " }"
                      for s in recipe.steps)
    text = (f"# the recipe {recipe.describe()} of fleet model '{model.name}', as a one-candidate plan\n"
            f"[[stage]]\nname = \"recipe\"\n\n[[stage.candidate]]\nlabel = {jsonio.dumps(model.name)}\n"
            f"precision = \"{precision}\"\nsteps = [{steps}]\n")
    path = cache.root / "plans" / f"{digest(text)}.toml"
    if not path.is_file():
        atomic.write_text(path, text)
    return str(path)

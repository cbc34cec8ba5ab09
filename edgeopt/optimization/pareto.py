"""Multi-objective search (``edgeopt optimize --search pareto``): an Optuna study over recipe parameters.

Each trial suggests a recipe — precision (FP32, FP16, INT8, INT8 or INT4 weight-only, as far as the device runs
them), INT8 preset and fast/full bias correction, SmoothQuant alpha (transformers), INT4 ratio and group size,
structured pruning ratio (PyTorch models; recovered by distillation) — builds and measures it through the staged
search's ``Builder`` (same content-addressed cache, same measurement settings), and reports three objectives to
minimise: the profile's latency figure (p50 unless its objective is another latency), file size, and the
quality gate's own figure (top-1 drop with labels, else 1 − the worst gated cosine). The device's budgets and
the gate are constraints (Optuna's ``constraints_func``: a trial is feasible when every value is ≤ 0).

The study lives in the cache folder (``studies/<key>.journal``, Optuna's JournalStorage), keyed by everything the
cache keys plus the search's own settings, so an interrupted or repeated run goes on from the stored trials,
and trials already built come from the cache: a re-run builds nothing. The first trials are the configurations
the staged plan measures first (FP32, FP16, INT8 with defaults), so the search starts from what the plan would
find. Trials are deterministic for a seed given the same measurements (which the cache keeps).

The artifact chosen is the staged plan's rule (``candidate.choose``): the lowest objective figure among the
trials that meet every budget and the gate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgeopt.evaluate import Quality, QualityGate
from edgeopt.errors import BadInputError
from edgeopt.model_type import detect_model_type
from edgeopt.optimization.cache import Cache, digest
from edgeopt.optimization.candidate import Candidate, choose, closest
from edgeopt.optimization.plan import PlannedCandidate
from edgeopt.optimization.search import Builder, OptimizeResult, prepare
from edgeopt.recipe import Recipe, checked, make_step
from edgeopt.targets import Measuring, Target

SAMPLERS = ("nsga2", "tpe")
LATENCY_OBJECTIVES = ("p50_ms", "p95_ms", "p99_ms")
STAGE = "pareto"

# precision choice -> the model precision the device must run
PRECISION_CHOICES = {"fp32": "fp32", "fp16": "fp16", "int8": "int8", "int8-weights": "int8", "int4-weights": "int8"}
PRUNE_RATIOS = (0.0, 0.25, 0.5, 0.75)
INT4_RATIOS = (0.5, 0.75, 1.0)
INT4_GROUP_SIZES = (32, 64, 128)
SMOOTH_QUANT_ALPHAS = (-1.0, 0.5, 0.75, 0.95)  # -1: off


@dataclass(frozen=True)
class ParetoSearch:
    """How to search: ``trials`` in all (stored trials count), Optuna's ``sampler`` (NSGA-II or TPE)."""

    trials: int = 24
    sampler: str = "nsga2"

    def __post_init__(self):
        if self.sampler not in SAMPLERS:
            raise BadInputError(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.trials < 1:
            raise BadInputError(f"trials must be at least 1, got {self.trials}")


@dataclass(frozen=True)
class Space:
    """The parameters a trial may set, for this model on this device.

    Seam for the repair ladder (how many of the most sensitive ops stay in float): when that step parameter
    exists, it becomes one more integer suggestion in ``_int8_params``, bounded by a field here.
    """

    precisions: tuple[str, ...]  # keys of PRECISION_CHOICES the device runs
    prune: bool  # a PyTorch model: structured pruning (+ distillation) is possible
    transformer: bool  # SmoothQuant alpha is a parameter (NNCF applies it to transformers only)

    def describe(self) -> dict:
        parameters = {"precision": list(self.precisions)}
        if self.prune:
            parameters["prune_ratio"] = list(PRUNE_RATIOS)
        if "int8" in self.precisions:
            parameters |= {"preset": ["auto", self.other_preset], "fast_bias_correction": [True, False]}
            if self.transformer:
                parameters["smooth_quant_alpha"] = list(SMOOTH_QUANT_ALPHAS)
        if "int4-weights" in self.precisions:
            parameters |= {"int4_ratio": list(INT4_RATIOS), "int4_group_size": list(INT4_GROUP_SIZES)}
        return parameters

    @property
    def other_preset(self) -> str:
        """The preset NNCF's default for this model type is not (``auto`` may measure both on a CNN with
        negative-tail activations, ``edgeopt.presets``; then this trial can repeat its pick)."""
        return "performance" if self.transformer else "mixed"

    def starting_points(self) -> list[dict]:
        """The staged plan's first candidates (baseline and cheap wins, default parameters) that this device runs."""
        points = [{"precision": p} for p in ("fp32", "fp16") if p in self.precisions]
        if "int8" in self.precisions:
            points.append({"precision": "int8", "preset": "auto", "fast_bias_correction": True}
                          | ({"smooth_quant_alpha": SMOOTH_QUANT_ALPHAS[-1]} if self.transformer else {}))
        return [point | ({"prune_ratio": 0.0} if self.prune else {}) for point in points]


def build_space(target: Target, source) -> Space:
    """The search space for ``source`` (``source.SourceModel``) on ``target``: precisions it runs, pruning for
    PyTorch models, SmoothQuant for transformers."""
    precisions = tuple(choice for choice, needs in PRECISION_CHOICES.items() if needs in target.precisions)
    transformer = "int8" in precisions and detect_model_type(source.model_type, source.openvino_model()).is_transformer
    return Space(precisions, source.kind == "torch", transformer)


def suggest(trial, space: Space) -> tuple[str, Recipe]:
    """The model precision and the recipe ``trial`` (an Optuna trial, or a ``FixedTrial`` of stored params) picks."""
    choice = trial.suggest_categorical("precision", space.precisions)
    steps = []
    ratio = trial.suggest_categorical("prune_ratio", PRUNE_RATIOS) if space.prune else 0.0
    if ratio:
        steps += [make_step("prune", {"ratio": ratio}), make_step("distill")]
    if choice == "fp16":
        steps.append(make_step("fp16"))
    elif choice == "int8":
        steps.append(make_step("int8", _int8_params(trial, space)))
    elif choice == "int8-weights":
        steps.append(make_step("weights", {"mode": "int8_asym"}))
    elif choice == "int4-weights":
        steps.append(make_step("weights", {
            "mode": "int4_sym", "ratio": trial.suggest_categorical("int4_ratio", INT4_RATIOS),
            "group_size": trial.suggest_categorical("int4_group_size", INT4_GROUP_SIZES),
            "group_fallback": "adjust"}))  # layers narrower than the group take a group size that divides them
    return PRECISION_CHOICES[choice], checked(Recipe(tuple(steps)))


def _int8_params(trial, space: Space) -> dict:
    params = {"preset": trial.suggest_categorical("preset", ("auto", space.other_preset)),
              "fast_bias_correction": trial.suggest_categorical("fast_bias_correction", (True, False))}
    if space.transformer:
        params["smooth_quant_alpha"] = trial.suggest_categorical("smooth_quant_alpha", SMOOTH_QUANT_ALPHAS)
    return params


def quality_loss(gate: QualityGate, reference: Quality, quality: Quality) -> float:
    """The gate's own figure as a loss (lower is better): the task metric's drop when the gate has one, the
    top-1 drop when labels exist, else 1 − the worst cosine among the outputs the gate looks at."""
    checked = gate.metric_check(reference, quality)
    if checked is not None:
        return checked.drop
    if reference.top1 is not None and quality.top1 is not None:
        return reference.top1 - quality.top1
    gated = gate.gated(quality) or ([quality.fidelity] if quality.fidelity else [])
    return 1.0 - min(f.cosine for f in gated) if gated else 0.0


def constraints(candidate: Candidate) -> dict[str, float]:
    """Optuna constraints (≤ 0 is satisfied): the quality gate, then each budget's relative excess."""
    values = {"quality_gate": 0.0 if candidate.gate_passed else 1.0}
    for check in candidate.checks:
        excess = 1.0 if check.measured is None else (check.measured - check.budget) / check.budget
        values[check.name] = min(excess, 0.0) if check.passed else max(excess, 1e-9)
    return values


def search_pareto(model: str, calibration: str, eval_data: str, target: Target, *, gate: QualityGate, cache: Cache,
                  settings: ParetoSearch = ParetoSearch(), measuring: Measuring = Measuring(),
                  objective: str = "p50_ms", input_shapes: dict | None = None, seed: int = 0,
                  progress: Callable[[Candidate, str], None] = lambda candidate, event: None) -> OptimizeResult:
    """Run (or resume) the study until it holds ``settings.trials`` finished trials; return every trial as a
    candidate, the chosen one by the staged plan's rule, and the study in ``OptimizeResult.pareto``."""
    try:
        import optuna
        from optuna.trial import FixedTrial, TrialState
    except ImportError:
        raise BadInputError("the Pareto search needs Optuna: pip install 'edgeopt[search]'") from None
    builder, source = prepare(model, calibration, eval_data, target, gate=gate, cache=cache, measuring=measuring,
                              objective=objective, input_shapes=input_shapes, seed=seed, pool=None, progress=progress)
    gate = builder.gate  # with the profile's task metric, when it has one
    space = build_space(target, source)
    latency = objective if objective in LATENCY_OBJECTIVES else "p50_ms"
    key = digest({"inputs": builder.inputs, "measure": builder.measure_key, "space": space.describe(),
                  "sampler": settings.sampler, "latency": latency, "gate": repr(gate)})
    storage_path = cache.root / "studies" / f"{key}.journal"
    storage_path.parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(storage_path)))
    study = optuna.create_study(study_name=key, storage=storage, directions=["minimize"] * 3, load_if_exists=True)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)  # an interrupted run's trial: never finished, not counted
    stored = _finished(study)[:settings.trials]
    # seeded by how many trials are stored, so a resumed study draws new points instead of repeating the first
    study.sampler = _sampler(settings, seed + len(stored))
    if not study.get_trials(deepcopy=False):
        for point in space.starting_points()[:settings.trials]:
            study.enqueue_trial(point)

    trials: list[tuple[int, Candidate]] = []
    for trial in stored:  # from the cache: built and measured again only if the cache lost them
        precision, recipe = suggest(FixedTrial(trial.params), space)
        if "skipped" in trial.user_attrs:  # its build failed: no artifact to reuse, nothing to retry
            candidate = builder.candidate(STAGE, PlannedCandidate(_label(trial.number), precision, recipe))
            candidate.skipped = trial.user_attrs["skipped"]
        else:
            candidate = _evaluate(builder, latency, _label(trial.number), precision, recipe)
        trials.append((trial.number, candidate))
    while len(trials) < settings.trials:
        trial = study.ask()
        precision, recipe = suggest(trial, space)
        candidate = _evaluate(builder, latency, _label(trial.number), precision, recipe)
        trials.append((trial.number, candidate))
        # skip_if_finished: a concurrent run on the same study may have marked this trial interrupted
        if candidate.skipped:
            trial.set_user_attr("skipped", candidate.skipped)
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        else:
            trial.set_user_attr("constraints", list(constraints(candidate).values()))
            study.tell(trial, _values(candidate, latency, gate), skip_if_finished=True)
    candidates = [candidate for _, candidate in trials]
    rows = [_trial_row(number, candidate, latency, gate) for number, candidate in trials]
    front = _front([row for row in rows if row["feasible"]])
    for row in rows:
        row["on_front"] = row["label"] in front
    pareto = {"sampler": settings.sampler, "seed": seed, "trials_budget": settings.trials,
              "trials_resumed": len(stored), "storage": str(storage_path), "study": key,
              "space": space.describe(), "objectives": [latency, "file_mb", quality_name(candidates, gate)],
              "not_searched": [f"bf16: the profile pins the runtime's inference precision "
                               f"({target.settings.inference_precision}); it is not a model precision"],
              "trials": rows, "front": [row["label"] for row in rows if row["on_front"]]}
    return OptimizeResult(target, gate, objective, measuring, candidates,
                          [f"pareto search: {settings.trials} trials, {settings.sampler}, seed {seed}"],
                          choose(candidates, objective), closest(candidates),
                          builder.emulation.note if builder.emulation else None, cache.root,
                          f"none (--search pareto, {settings.sampler}; study {storage_path})",
                          {"model": str(model), "calibration": str(calibration), "evaluation": str(eval_data)},
                          pareto=pareto)


def _sampler(settings: ParetoSearch, seed: int):
    import optuna

    def constraints_func(trial) -> list[float]:
        return trial.user_attrs["constraints"]

    if settings.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constraints_func=constraints_func,
                                          n_startup_trials=max(4, settings.trials // 3))
    return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, settings.trials // 3),
                                         constraints_func=constraints_func)


def _finished(study) -> list:
    """Trials that ran to the end (measured, or failed to build), in order; interrupted ones do not count."""
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
            if t.state == TrialState.COMPLETE or "skipped" in t.user_attrs]


def _label(number: int) -> str:
    return f"t{number:03d}"


def _evaluate(builder: Builder, latency: str, label: str, precision: str, recipe: Recipe) -> Candidate:
    candidate = builder.candidate(STAGE, PlannedCandidate(label, precision, recipe))
    builder.build(candidate, recipe)
    if not candidate.skipped:
        builder.measure(candidate)
    if not candidate.skipped and candidate.figures.get(latency) is None:
        candidate.skipped = f"no {latency} figure was measured"
    builder.progress(candidate, "done")
    return candidate


def _values(candidate: Candidate, latency: str, gate: QualityGate) -> list[float]:
    return [candidate.figures[latency], candidate.file_bytes / 1e6, quality_loss(gate, *candidate.evaluation)]


def quality_name(candidates: list[Candidate], gate: QualityGate) -> str:
    """What the quality objective measures: the task metric's drop, the top-1 drop (labelled evaluation data)
    or 1 − cosine."""
    if gate.metric is not None:
        return "metric_drop"
    labelled = any(c.evaluation and c.evaluation[0].top1 is not None for c in candidates)
    return "top1_drop" if labelled else "one_minus_cosine"


def _trial_row(number: int, candidate: Candidate, latency: str, gate: QualityGate) -> dict:
    measured = not candidate.skipped
    return {"number": number, "label": candidate.label, "recipe": candidate.recipe, "precision": candidate.precision,
            "values": _values(candidate, latency, gate) if measured else None,
            "constraints": constraints(candidate) if measured else None,
            "feasible": candidate.passed, "skipped": candidate.skipped, "reused": dict(candidate.reused),
            "on_front": False}


def _front(rows: list[dict]) -> set[str]:
    """Labels of the rows no other row dominates (no worse on every objective, better on one)."""
    def dominates(a, b):
        return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))

    return {r["label"] for r in rows if not any(dominates(o["values"], r["values"]) for o in rows if o is not r)}


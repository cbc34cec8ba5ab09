"""INT8 repair: when INT8 misses the quality gate, a ladder of cheap fixes that stops at the first passing model.

Rungs, each kept when it closes at least a tenth of the gap to the gate (cumulative), each judged by the quality
gate on the evaluation set (``edgeopt.judge``, the measures the pipeline's gate applies):

1. ``int8``: the plain step (model type recognised from the source or graph, the preset ``auto`` gives it:
   ``edgeopt.presets``; a preset or SmoothQuant alpha it chose by measurement is pinned for the later rungs);
2. ``model_type``: a graph not recognised as a transformer, with MatMuls of two activations or a normalisation by
   a computed statistic (``edgeopt.model_type.computed_normalisations``), is tried as one (SmoothQuant, MIXED);
3. ``smooth_quant``: a transformer with SmoothQuant alpha 0.5 (besides the int8 step's 0.95 / off);
4. ``bias_correction``: full bias correction instead of the fast one;
5. ``preset``: MIXED (asymmetric activations), when ``auto`` did not try it (``edgeopt.presets``);
6. ``float_ops``: the k most sensitive operations (``edgeopt.sensitivity``) kept in float, at most
   ``max_float_share`` of the quantized operations; k by bisection on the INT8 model with the operations reverted
   (NNCF's accuracy-control edit: no calibration per probe); the reverted model is the result. With
   ``recalibrate`` the model is then calibrated once with them in NNCF's ignored scope, kept when it passes too
   (one int8 step reproduces it: ``recipe.toml``); off by default, as it missed the gate on both real models
   measured (bench/repair.py) and cost as much as a rung;
7. ``float_islands``: beyond that share, where the device runs float in FP16/BF16 (the profile's inference
   precision or its fp16 precision; on the host without a target) — the same bisection up to every operation.

Whenever plain INT8 misses the gate the report says why: the sensitivity ranking (a screen of every quantized
operation in one compiled model, the exact keep-it-alone-in-float probe for the worst) runs once — on plain INT8's
model when a rung before ``float_ops`` passes (the diagnosis, after the passing model is found), else on the closest
model of the ladder, the one ``float_ops`` reverts operations of — and ``float_reason`` says which operations were
left in float (possibly none) and why.

A result calibrated by the ladder is reproduced by one ``int8`` step (its parameters, ``ignored_scope`` included):
the pipeline writes it as ``recipe.toml`` beside the artifact. A reverted model (float_ops without
``recalibrate``) has no such step — no calibration makes it — and ``no_recipe`` says so; rerunning the
``int8_repair`` step reproduces it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from edgeopt.evaluate import QualityGate
from edgeopt.judge import Judge, Verdict
from edgeopt.model_type import TRANSFORMER, computed_normalisations, detect_model_type
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.config import StepConfig, number
from edgeopt.passes.quantize import Int8Config, Quantized, compress_quantized_weights, quantize_openvino
from edgeopt.passes.registry import GRAPH, register
from edgeopt.presets import MIXED, auto_presets
from edgeopt.sensitivity import Reverter, Sensitivity, analyse

SMOOTH_QUANT_ALPHA = 0.5  # the SmoothQuant paper's default; NNCF's is 0.95


@dataclass(frozen=True)
class Int8RepairConfig(StepConfig):
    """``max_float_share``: the most operations the ``float_ops`` rung keeps in float, as a share of the quantized
    ones; ``islands``: allow more (``float_islands``) where the device runs float in FP16/BF16;
    ``ranking_samples``: evaluation samples the sensitivity analysis runs on (those the INT8 model gets most
    wrong, as NNCF's accuracy control ranks; so few because each probed operation costs one model compile and one
    pass over them: the bisection on the ranking then judges every evaluation sample); ``probe_share``: the
    quantized operations probed exactly, the worst by the screen (at least ``max_float_share``'s; 1.0
    probes all); ``recalibrate``: calibrate the float_ops rung's result again with its operations in NNCF's
    ignored scope, for a one-step recipe (a different model, judged again: one more calibration)."""

    subset_size: int = number(300, "[1, inf)")
    max_float_share: float = number(0.1, "[0, 1]")
    ranking_samples: int = number(16, "[1, inf)")
    probe_share: float = number(0.2, "[0, 1]")
    islands: bool = True
    recalibrate: bool = False


@dataclass
class Rung:
    rung: str
    params: dict  # the int8 step's parameters tried, with what it chose by measurement (SmoothQuant alpha) pinned
    passed: bool
    check: str  # the gate's verdict in words
    score: float  # the gate's figure (Judge.score: minus the metric's drop, top-1, or worst gated cosine)
    seconds: float


@dataclass
class Repair:
    rungs: list[Rung] = field(default_factory=list)
    passed_rung: str | None = None
    step: dict | None = None  # the int8 step that reproduces the result: {"name": "int8", params...}
    float_ops: list[dict] = field(default_factory=list)  # {name, op_type, operations, gain, sqnr_db, ...}
    float_share: float = 0.0  # operations left in float / quantized operations of the INT8 model
    island_precision: str | None = None  # the precision the device runs the float operations in
    float_reason: str = ""  # why these operations (or none) were left in float, in words
    no_recipe: str | None = None  # why no one-step int8 recipe reproduces the result (None: recipe.toml does)
    sensitivity: Sensitivity | None = None  # None only when plain INT8 passed (nothing to diagnose)
    seconds: float = 0.0

    def describe(self) -> dict:
        return {"rungs": [asdict(r) for r in self.rungs], "passed_rung": self.passed_rung, "step": self.step,
                "float_ops": self.float_ops, "float_share": round(self.float_share, 4),
                "island_precision": self.island_precision, "float_reason": self.float_reason,
                "no_recipe": self.no_recipe,
                "sensitivity": self.sensitivity.describe() if self.sensitivity else None,
                "seconds": round(self.seconds, 3), "recipe": "recipe.toml" if self.step else None}


@register("int8_repair", Int8RepairConfig, stage=GRAPH, formats=("openvino",), sets_precision=True,
          needs_eval=True,
          summary="INT8 that repairs itself when it misses the gate: model type, SmoothQuant, bias correction, "
                  "preset, then the most sensitive operations kept in float (needs --eval)")
def int8_repair(model: WorkingModel, ctx: PassContext, config: Int8RepairConfig) -> None:
    start = time.perf_counter()
    gate = ctx.gate or QualityGate()
    fp32 = model.ov_model
    names = model.source.output_names
    judge = Judge(fp32, ctx.evaluation, gate, names)
    repair = Repair()

    def attempt(rung: str, params: dict) -> tuple[Verdict, Quantized, dict]:
        """The int8 step with ``params``, judged; the parameters returned pin what it chose by measurement."""
        began = time.perf_counter()
        quantized = quantize_openvino(fp32, model.source.model_type, ctx.calibration,
                                      Int8Config(subset_size=config.subset_size, **params), compress_weights=False)
        verdict = judge(quantized.model, rung)
        params = {**params, **_chosen(quantized)}
        repair.rungs.append(Rung(rung, params, verdict.passed, verdict.check, judge.score(verdict),
                                 round(time.perf_counter() - began, 3)))
        return verdict, quantized, params

    def rank(verdict: Verdict, quantized: Quantized, rung: str) -> Reverter:
        """The sensitivity ranking of ``rung``'s INT8 model, on the samples it gets most wrong, into the report."""
        reverter = Reverter(fp32, quantized.model)
        samples = judge.worst_samples(verdict, config.ranking_samples)
        every = samples is judge.samples  # then the ladder's judge and its verdict on the model are reused
        repair.sensitivity = analyse(
            fp32, quantized.model, samples, gate, names, quiet=ctx.quiet, reverter=reverter,
            judge=judge if every else None, int8=verdict if every else None, model=rung,
            probe_share=max(config.probe_share, config.max_float_share),
            subset=(f"all {len(samples)} evaluation samples" if every else f"the {len(samples)} of "
                    f"{len(judge.samples)} evaluation samples the INT8 model gets most wrong (NNCF's ranking subset "
                    "selection)"))
        return reverter

    params, best, plain = {}, None, None
    for rung, change in _ladder(fp32, model.source.model_type):
        verdict, quantized, trial = attempt(rung, {**params, **change})
        if verdict.passed:
            if plain is not None:  # plain INT8 missed the gate: say why, though no operation stays in float
                rank(*plain, "int8")
                repair.float_reason = (f"none: rung {rung} passed the gate before the float_ops rung "
                                       f"({verdict.check}); the ranking diagnoses plain INT8")
            return _finish(model, repair, rung, trial, quantized.model, quantized.note, start)
        plain = plain or (verdict, quantized)
        if best is None or _closer(judge, judge.score(verdict), judge.score(best[0])):
            params, best = trial, (verdict, quantized, rung)

    reverter = rank(*best)
    ranked = list(repair.sensitivity.ranked)
    total = max(repair.sensitivity.quantized_ops, 1)

    def operations(k: int) -> list[str]:
        return list(dict.fromkeys(op for group in ranked[:k] for op in group.operations))

    closest = {}  # the failing reverted model closest to passing: score, k, model, rung, verdict

    def reverted(rung: str, k: int) -> tuple[Verdict, object]:
        """The INT8 model with the k most sensitive operations reverted to float (no new calibration)."""
        began = time.perf_counter()
        candidate = reverter.keep_in_float([op.name for op in ranked[:k]])
        verdict = judge(candidate, rung)
        score = judge.score(verdict)
        repair.rungs.append(Rung(f"{rung} k={k} (reverted)", {**params, "ignored_scope": operations(k)},
                                 verdict.passed, verdict.check, score, round(time.perf_counter() - began, 3)))
        if not closest or _closer(judge, score, closest["score"]):
            closest.update(score=score, k=k, model=candidate, rung=rung, verdict=verdict)
        return verdict, candidate

    cap = max((k for k in range(len(ranked) + 1) if len(operations(k)) <= config.max_float_share * total), default=0)
    island_precision = _island_precision(ctx.target)
    for rung, low, high in (("float_ops", 0, cap),
                            ("float_islands", cap, len(ranked) if config.islands and island_precision else cap)):
        if high <= low:
            continue
        found = _bisect(low, high, lambda k: reverted(rung, k))
        if found is None:
            continue
        k, candidate = found
        repair.float_ops = [{**_float_op(op), "rank": i + 1} for i, op in enumerate(ranked[:k])]
        repair.float_share = len(operations(k)) / total
        repair.island_precision = island_precision if rung == "float_islands" else None
        share = (f"beyond max_float_share {config.max_float_share:.0%}, as {island_precision} islands"
                 if rung == "float_islands" else f"within max_float_share {config.max_float_share:.0%}")
        repair.float_reason = (f"the {k} most sensitive of {len(ranked)} ranked groups ({len(operations(k))} of "
                               f"{total} quantized operations, {share}) of rung {best[2]}'s model: the fewest, by "
                               "bisection on the ranking, whose reverted model passes the gate; each one's gain is "
                               "what keeping it alone in float recovered (null: ranked by the screen only)")
        if config.recalibrate:  # the same operations in NNCF's ignored scope: one int8 step reproduces that
            verdict, quantized, step = attempt(f"{rung} k={k}", {**params, "ignored_scope": operations(k)})
            if verdict.passed:
                return _finish(model, repair, rung, step, quantized.model, quantized.note, start)
            repair.no_recipe = (f"recalibrated with the same operations in NNCF's ignored scope the model misses "
                                f"the gate ({verdict.check}), so the reverted model is kept: rerun int8_repair")
        else:
            repair.no_recipe = ("the operations are reverted in rung " + best[2] + "'s calibrated model (NNCF's "
                                "accuracy-control edit), which no int8 step reproduces: rerun int8_repair, or set "
                                "recalibrate = true to try them in NNCF's ignored scope (a new calibration)")
        model.notes.append(f"int8_repair: no one-step recipe: {repair.no_recipe}")
        return _finish(model, repair, rung, None, candidate, best[1].note, start)
    islands = ("" if not config.islands else "; no float islands: the device does not run float in FP16/BF16"
               if island_precision is None else f", nor all {len(ranked)} in {island_precision} (quantizers the "
               f"ranking has no group for, such as those of element-wise and reduction ops, stay)")
    none = (f"none: no k up to {cap} of the {len(ranked)} ranked groups (max_float_share "
            f"{config.max_float_share:.0%}) passed the gate{islands}")
    if closest and _closer(judge, closest["score"], judge.score(best[0])):  # a reverted model came closer
        k = closest["k"]
        repair.float_ops = [{**_float_op(op), "rank": i + 1} for i, op in enumerate(ranked[:k])]
        repair.float_share = len(operations(k)) / total
        repair.island_precision = island_precision if closest["rung"] == "float_islands" else None
        repair.float_reason = (f"{none}; the closest, rung {closest['rung']} k={k} ({len(operations(k))} of {total} "
                               f"quantized operations reverted to float in rung {best[2]}'s model), is kept")
        model.notes.append("int8_repair: no rung passed the quality gate; keeping the closest model, "
                           f"{closest['rung']} k={k} ({closest['verdict'].check})")
        return _finish(model, repair, None, None, closest["model"], best[1].note, start)
    repair.float_reason = f"{none}; the closest model, rung {best[2]}'s, is kept"
    model.notes.append("int8_repair: no rung passed the quality gate; keeping the closest model "
                       f"({best[0].check})")
    _finish(model, repair, None, params, best[1].model, best[1].note, start)


def _chosen(quantized: Quantized) -> dict:
    """What the int8 step chose by measurement, pinned for the later rungs and the final recipe: a transformer's
    SmoothQuant alpha, a CNN's preset (choosing again would cost two calibrations per rung, and could pick
    differently)."""
    chosen = {"smooth_quant_alpha": quantized.smooth_quant_alpha} if quantized.smooth_quant_alpha is not None else {}
    measured = quantized.preset is not None and quantized.preset.chosen_by == "measurement"
    return chosen | ({"preset": quantized.preset.name} if measured else {})


def _closer(judge: Judge, score: float, best: float) -> bool:
    """Whether a rung's change is worth keeping: it closes at least a tenth of the gap to the gate (a change that
    moves the figure by noise would only cost time in every later calibration, e.g. full bias correction)."""
    return score - best >= 0.1 * max(judge.threshold - best, 0.0)


def _ladder(ov_model, source_model_type: str | None) -> list[tuple[str, dict]]:
    """The rungs that apply to this model, as changes to the int8 step's parameters."""
    transformer = detect_model_type(source_model_type, ov_model).name == TRANSFORMER
    rungs = [("int8", {})]
    if not transformer and (any(_activation_matmul(op) for op in ov_model.get_ops())
                            or computed_normalisations(ov_model)):
        rungs.append(("model_type", {"model_type": "transformer", "preset": "auto"}))  # not a CNN's pinned preset
    if transformer:
        rungs.append(("smooth_quant", {"smooth_quant_alpha": SMOOTH_QUANT_ALPHA}))
    # transformers too: on all-MiniLM-L6-v2 at cosine 0.997 full bias correction closes only 11 % of the gap, yet
    # without it no k within max_float_share passes (float islands of 8 of 39 operations do; bench/repair.py)
    rungs.append(("bias_correction", {"fast_bias_correction": False}))
    if MIXED not in auto_presets(ov_model, transformer).presets:
        rungs.append(("preset", {"preset": MIXED}))
    return rungs


def _activation_matmul(op) -> bool:
    """A MatMul of two activations (attention scores or their use), not a layer with a weight."""
    if op.get_type_name() != "MatMul":
        return False
    sources = [op.input_value(i).get_node() for i in range(2)]
    sources = [s.input_value(0).get_node() if s.get_type_name() == "Convert" else s for s in sources]
    return all(s.get_type_name() != "Constant" for s in sources)


def _bisect(low: int, high: int, probe) -> tuple[int, object] | None:
    """The smallest k in (low, high] whose ``probe(k) -> (verdict, model)`` passes, assuming more float never
    hurts (``high`` itself is tried last, only when nothing below it passed); None when none does."""
    found = None
    while high - low > 1:
        middle = (low + high) // 2
        verdict, candidate = probe(middle)
        if verdict.passed:
            high, found = middle, (middle, candidate)
        else:
            low = middle
    if found is None:
        verdict, candidate = probe(high)
        found = (high, candidate) if verdict.passed else None
    return found


def _island_precision(target) -> str | None:
    """The float precision the device runs islands in, when it runs FP16/BF16 (the host's f32 without a target)."""
    if target is None:
        return "f32"
    if target.settings.inference_precision in ("f16", "bf16"):
        return target.settings.inference_precision
    return "f16" if "fp16" in target.precisions else None


def _float_op(op) -> dict:
    return {"name": op.name, "label": op.label, "op_type": op.op_type, "operations": list(op.operations),
            "probed": op.probed, "gain": op.gain, "score": op.score, "sqnr_db": op.sqnr_db,
            "screen_gain": op.screen_gain, "screen_noise_db": op.screen_noise_db, "range_ratio": op.range_ratio,
            "clipped": op.clipped}


def _finish(model: WorkingModel, repair: Repair, rung: str | None, step: dict | None, ov_model, note: str,
            start: float) -> None:
    compress_quantized_weights(ov_model)
    model.graphs["openvino"] = ov_model
    model.precision = "int8"
    model.float_weights_fp16 = True
    repair.passed_rung = rung
    repair.step = {"name": "int8", **step} if step is not None else None
    repair.seconds = time.perf_counter() - start
    model.decisions["int8_repair"] = repair.describe()
    if repair.step is not None:
        model.reproduce["int8_repair"] = repair.step
    tried = ", ".join(f"{r.rung} {'pass' if r.passed else 'fail'} ({r.score:.4f})" for r in repair.rungs)
    kept = (f"; {len(repair.float_ops)} operation(s) in float ({repair.float_share:.1%} of the quantized ones): "
            + ", ".join(op["name"] for op in repair.float_ops)) if repair.float_ops else ""
    model.notes.append(f"int8_repair: {'passed at rung ' + rung if rung else 'no rung passed'} after "
                       f"{len(repair.rungs)} trial(s) in {repair.seconds:.1f} s ({tried}){kept}; int8 {note}")

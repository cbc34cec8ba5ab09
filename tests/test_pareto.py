"""`edgeopt optimize --search pareto`: the space, the front, the CLI, and end to end on the ResNet sample against
the staged plan (real NNCF, OpenVINO, Optuna; few timed runs; one cache shared by both searches)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from optuna.trial import FixedTrial

from conftest import ROOT, report_schema_errors
from edgeopt.errors import BadInputError
from edgeopt.evaluate import Fidelity, Quality, QualityGate
from edgeopt.optimization.candidate import TIE_TOLERANCE
from edgeopt.optimization.pareto import (PRECISION_CHOICES, ParetoSearch, Space, _front, _sampler, quality_loss,
                                     suggest)
from edgeopt.optimization.plan import load_plan

RESNET = f"{ROOT / 'samples' / 'resnet_digits' / 'model.py'}:build"
RESNET_CALIB = f"{ROOT / 'samples' / 'resnet_digits' / 'datasets.py'}:calib"
RESNET_EVAL = f"{ROOT / 'samples' / 'resnet_digits' / 'datasets.py'}:eval"
FEW_RUNS = ("--runs", "30", "--warmup", "5", "--min-seconds", "0")
TRIALS = 6
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CNN = Space(tuple(PRECISION_CHOICES), prune=True, transformer=False)


def optimize(*args):
    from edgeopt.cli import main

    return CliRunner().invoke(main, ["optimize", *map(str, args), *FEW_RUNS], catch_exceptions=False)


def test_starting_points_are_the_staged_plans_first_candidates():
    """The study starts from the plan's baseline and cheap wins with the same recipes, so they share cache entries."""
    planned = {c.label: c.recipe.key() for stage in load_plan()[:2] for c in stage.candidates}
    started = [suggest(FixedTrial(point), CNN)[1].key() for point in CNN.starting_points()]
    assert started == [planned["fp32"], planned["fp16"], planned["int8"]]
    only_int8 = Space(("int8", "int8-weights", "int4-weights"), prune=False, transformer=False)
    assert [p["precision"] for p in only_int8.starting_points()] == ["int8"]


def test_every_choice_gives_a_checked_recipe_of_the_right_precision():
    cases = {("fp32", 0.5): ("fp32", ["prune", "distill"]), ("fp16", 0.0): ("fp16", ["fp16"]),
             ("int8", 0.25): ("int8", ["prune", "distill", "int8"]), ("int8-weights", 0.0): ("int8", ["weights"]),
             ("int4-weights", 0.0): ("int8", ["weights"])}
    for (choice, ratio), (precision, names) in cases.items():
        params = {"precision": choice, "prune_ratio": ratio, "preset": "mixed", "fast_bias_correction": False,
                  "int4_ratio": 0.75, "int4_group_size": 64}
        got, recipe = suggest(FixedTrial(params), CNN)
        assert (got, recipe.names) == (precision, names)
    _, recipe = suggest(FixedTrial({"precision": "int4-weights", "prune_ratio": 0.0, "int4_ratio": 0.75,
                                    "int4_group_size": 64}), CNN)
    assert recipe.steps[0].params == {"mode": "int4_sym", "ratio": 0.75, "group_size": 64,
                                    "group_fallback": "adjust"}
    transformer = Space(("int8",), prune=False, transformer=True)
    _, recipe = suggest(FixedTrial({"precision": "int8", "preset": "performance", "fast_bias_correction": True,
                                    "smooth_quant_alpha": 0.5}), transformer)
    assert recipe.steps[0].params["smooth_quant_alpha"] == 0.5 and "smooth_quant_alpha" in transformer.describe()
    assert "smooth_quant_alpha" not in CNN.describe() and CNN.describe()["preset"] == ["auto", "mixed"]


def test_same_seed_same_trials_and_a_resumed_study_draws_new_ones():
    """The sampler is seeded: the same seed and values give the same trials; a study resumed after k trials is
    seeded with seed + k, so it does not repeat the first draws."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def run(seed: int, n: int) -> list[dict]:
        settings = ParetoSearch(trials=n)
        study = optuna.create_study(directions=["minimize"] * 3, sampler=_sampler(settings, seed))
        for point in CNN.starting_points():
            study.enqueue_trial(point)
        for _ in range(n):
            trial = study.ask()
            precision, recipe = suggest(trial, CNN)
            trial.set_user_attr("constraints", [0.0])
            study.tell(trial, [len(recipe.steps), float(len(recipe.describe())), 1.0 if precision == "int8" else 0.0])
        return [t.params for t in study.trials]

    first = run(0, 8)
    assert first == run(0, 8)
    assert first[:3] == CNN.starting_points()
    assert run(3, 8)[3:] != first[3:]


def test_front_is_the_non_dominated_feasible_trials():
    rows = [{"label": "a", "values": [1.0, 3.0, 0.0]}, {"label": "b", "values": [2.0, 1.0, 0.0]},
            {"label": "c", "values": [2.0, 3.0, 0.0]}, {"label": "d", "values": [1.0, 3.0, 0.0]}]
    assert _front(rows) == {"a", "b", "d"}  # c is dominated by a; equal points do not dominate each other


def test_quality_loss_is_the_gates_figure():
    gate = QualityGate(max_drop=0.01, min_cosine=0.99)
    reference = Quality("original", 0.9, None)
    assert quality_loss(gate, reference, Quality("int8", 0.88, None)) == pytest.approx(0.02)
    outputs = (Fidelity(0.999, 0.1, 0.01, None, "a"), Fidelity(0.95, 0.3, 0.05, None, "b"))
    unlabelled = Quality("int8", None, outputs[1], outputs=outputs)
    assert quality_loss(gate, Quality("original", None, None), unlabelled) == pytest.approx(0.05)
    assert quality_loss(QualityGate(outputs=("a",)), Quality("original", None, None), unlabelled) == pytest.approx(0.001)


def test_bad_settings_are_usage_errors(cli, tiny_factory, tiny_calib, tmp_path):
    with pytest.raises(BadInputError, match="sampler"):
        ParetoSearch(sampler="random")
    base = ("optimize", tiny_factory, "--target", "digits-tight", "--calib", tiny_calib, "--eval", tiny_calib,
            "--out", tmp_path / "out", "--cache", tmp_path / "cache")
    result = cli(*base, "--trials", "3")
    assert result.exit_code == 2 and "--search pareto" in result.stderr
    result = cli(*base, "--search", "pareto", "--plan", ROOT / "edgeopt" / "optimize" / "plan.toml")
    assert result.exit_code == 2 and "no plan" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """The staged plan, then the Pareto search, on the ResNet sample for the generic 2-core box, one cache."""
    root = tmp_path_factory.mktemp("pareto-resnet")
    common = (RESNET, "--target", "generic-x86-avx2-2core", "--calib", RESNET_CALIB, "--eval", RESNET_EVAL,
              "--cache", root / "cache")
    staged = optimize(*common, "--out", root / "staged")
    pareto = optimize(*common, "--out", root / "pareto", "--search", "pareto", "--trials", TRIALS)
    return root, common, staged, pareto


def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


@pytest.mark.slow
def test_pareto_is_at_least_as_good_as_the_staged_plan_and_draws_its_front(resnet):
    root, _, staged, pareto = resnet
    assert staged.exit_code == 0, staged.output
    assert pareto.exit_code == 0, pareto.output
    plan, found = _report(root / "staged"), _report(root / "pareto")
    assert report_schema_errors(found) == []
    objective = found["objective"]
    assert objective == plan["objective"]
    by_label = {c["label"]: c for c in found["candidates"]}
    chosen, planned = by_label[found["chosen"]], next(c for c in plan["candidates"] if c["label"] == plan["chosen"])
    assert chosen["passed"] and chosen["figures"][objective] <= planned["figures"][objective] * (1 + TIE_TOLERANCE)
    trials = found["pareto"]["trials"]
    assert len(trials) == len(found["candidates"]) == TRIALS
    assert found["pareto"]["trials_resumed"] == 0
    assert all(t["constraints"] is not None and t["values"] is not None for t in trials if not t["skipped"])
    assert all(t["feasible"] == by_label[t["label"]]["passed"] for t in trials)
    assert found["pareto"]["front"] and all(by_label[label]["passed"] for label in found["pareto"]["front"])
    # the starting points are the plan's baseline and cheap wins: the same cache entries, not built again
    planned = [c for c in plan["candidates"] if c["stage"] in ("baseline", "cheap wins")]
    for started, candidate in zip(found["candidates"][:3], planned, strict=True):
        assert started["precision"] == candidate["precision"] and started["file_bytes"] == candidate["file_bytes"]
        assert started["reused"] == {"artifact": True, "measurement": True}
        assert started["figures"] == candidate["figures"]
    assert (root / "pareto" / "pareto.png").read_bytes().startswith(PNG_MAGIC)
    html = (root / "pareto" / "report.html").read_text()
    src = html.split("alt='Pareto front' src='data:image/png;base64,")[1].split("'")[0]
    assert base64.b64decode(src).startswith(PNG_MAGIC)
    markdown = (root / "pareto" / "report.md").read_text()
    assert "![Pareto front](pareto.png)" in markdown and "## Pareto trials" in markdown
    for t in trials:
        assert f" {t['label']} " in markdown


@pytest.mark.slow
def test_resume_from_the_stored_study_builds_nothing(resnet, tmp_path):
    root, common, _, pareto = resnet
    assert pareto.exit_code == 0, pareto.output
    again = optimize(*common, "--out", tmp_path / "again", "--search", "pareto", "--trials", TRIALS)
    assert again.exit_code == 0, again.output
    first, report = _report(root / "pareto"), _report(tmp_path / "again")
    assert report["pareto"]["trials_resumed"] == TRIALS and report["pareto"]["study"] == first["pareto"]["study"]
    hits = [c["reused"] for c in report["candidates"] if not c["skipped"]]
    assert hits and all(hit == {"artifact": True, "measurement": True} for hit in hits)
    assert [t["number"] for t in report["pareto"]["trials"]] == [t["number"] for t in first["pareto"]["trials"]]
    assert report["chosen"] == first["chosen"] and report["pareto"]["front"] == first["pareto"]["front"]

"""Typed step configs: every parameter of every step is checked (type, range, choice) when the recipe is parsed,
before anything is loaded, with one line naming the step and the parameter."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path
from typing import Literal

import pytest

from edgeopt.errors import BadInputError
from edgeopt.passes.config import interval_of
from edgeopt.passes.registry import all_passes
from edgeopt.recipe import build_recipe, parse_recipe

STEPS = {info.name: info for info in all_passes()}


def _bad_values(config, item) -> list:
    """Values that must be refused for this field: a wrong type, and a value outside its interval or choices."""
    annotation = typing.get_type_hints(config)[item.name]
    union = typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType"))
    options = [a for a in typing.get_args(annotation) if a is not type(None)] if union else [annotation]
    kinds = {typing.get_origin(a) or a for a in options}
    bad = []
    if Literal in kinds:
        bad += ["bogus", 3]
    elif bool in kinds:
        bad += ["yes", 1]
    elif float in kinds:
        bad += ["fast", True]
    elif int in kinds:
        bad += [2.5, "many", True]
    elif str in kinds:
        bad += [5]
    elif list in kinds:
        bad += ["conv1", [1, 2]]
    elif dict in kinds:
        bad += ["conv1", {"conv1": "half"}]
    interval = interval_of(config, item.name)
    if interval:
        low, high = (float(x) for x in interval[1:-1].split(","))
        bad += [v for v in ((low if interval[0] == "(" else low - 1), (high if interval[-1] == ")" else high + 1))
                if abs(v) != float("inf")]
    return bad


CASES = [(name, item.name, value) for name, info in sorted(STEPS.items())
         for item in dataclasses.fields(info.config) for value in _bad_values(info.config, item)]


def test_every_step_parameter_has_bad_values_to_try():
    covered = {(name, param) for name, param, _ in CASES}
    every = {(name, item.name) for name, info in STEPS.items() for item in dataclasses.fields(info.config)}
    assert covered == every


@pytest.mark.parametrize("step, param, value", CASES, ids=[f"{s}.{p}={v!r}" for s, p, v in CASES])
def test_bad_parameter_is_refused_at_parse_time(tmp_path, step, param, value):
    import tomli_w

    recipe = tmp_path / "r.toml"
    recipe.write_text(tomli_w.dumps({"step": [{"name": step, param: value}]}))
    with pytest.raises(BadInputError) as caught:
        parse_recipe(str(recipe))
    message = str(caught.value)
    assert "\n" not in message and f"{step}: {param}" in message and str(recipe) in message


@pytest.mark.parametrize("text, message", [
    ('name = "weights"\nmode = "int8_sym"\ngroup_size = 32', "group_size applies to INT4 modes only"),
    ('name = "weights"\nmode = "int4_sym"\ngroup_size = 0', "group_size must be a positive integer or -1"),
    ('name = "weights"\nmode = "int8_asym"\nawq = true', "awq apply to INT4 modes only"),
    ('name = "weights"\nmode = "int8_sym"\ntarget = "raspberry-pi-4"', "'target' only applies to mode=auto"),
    ('name = "weights"\ntarget = "no-such-device"', "unknown target 'no-such-device'"),
    ('name = "sparsify"\nmode = "regularization"\nepochs = 0', "learns its masks; give epochs >= 1"),
    ('name = "prune"\nlayer_ratios = { conv1 = 1.0 }', "layer_ratios[conv1] must be in [0, 1)"),
    ('name = "int8"\nturbo = true', "unknown parameter(s) turbo"),
])
def test_rules_between_parameters(tmp_path, text, message):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"[[step]]\n{text}\n")
    with pytest.raises(BadInputError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_recipe(str(recipe))


def test_good_parameters_build_typed_configs(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[step]]\nname = "prune"\nratio = 0.25\nlayer_ratios = { conv2 = 0.5 }\n'
                      '[[step]]\nname = "distill"\nepochs = 1\nlr = 1\n'
                      '[[step]]\nname = "int8"\npreset = "mixed"\nignored_scope = ["a"]\n')
    parsed = parse_recipe(str(recipe))
    prune, distill, int8 = (step.config for step in parsed.steps)
    assert (prune.ratio, prune.layer_ratios, prune.scope) == (0.25, {"conv2": 0.5}, "layer")
    assert (distill.epochs, distill.lr) == (1, 1)
    assert (int8.preset, int8.ignored_scope, int8.subset_size) == ("mixed", ["a"], 300)
    assert parsed.key()[2] == ["int8", {"preset": "mixed", "subset_size": 300, "fast_bias_correction": True,
                                        "ignored_scope": ["a"], "ignored_patterns": None, "model_type": "auto",
                                        "smooth_quant_alpha": None, "ffn_down_float": True,
                                        "recurrent_float": True, "onnx_backend": "auto"}]


@pytest.mark.parametrize("text, message", [
    ("int8,prune", "PyTorch steps must come before graph steps"),
    ("qat,int8", "qat already sets the model's precision"),
    ("int8,fp16", "int8 already sets the model's precision"),
    ("nope", "unknown recipe step 'nope'"),
])
def test_rules_between_steps(text, message):
    with pytest.raises(BadInputError, match=message):
        parse_recipe(text)


def test_precision_shorthand_and_target_preference():
    from edgeopt.targets import load_target

    assert build_recipe(None).names == ["int8"]
    assert build_recipe(None, "fp32").names == []
    assert build_recipe("prune,distill").names == ["prune", "distill"]  # no precision step: FP32
    pi = load_target("raspberry-pi-4")
    assert build_recipe("prune,distill", target=pi).names == ["prune", "distill", pi.precisions[0]]
    assert build_recipe("fp16", target=pi).names == ["fp16"]  # the recipe decides
    with pytest.raises(BadInputError, match="give either --precision or a recipe with a precision step"):
        build_recipe("int8", "fp16")


def test_cli_bad_parameter_exits_2_before_the_model_is_loaded(tmp_path, tiny_calib):
    """prune → distill(10 epochs) → int8(preset=bogus): one line, exit 2, and the model factory never ran."""
    marker = tmp_path / "loaded"
    factory = tmp_path / "model.py"
    factory.write_text(f"import pathlib\ndef build():\n    pathlib.Path({str(marker)!r}).write_text('x')\n"
                       "    raise SystemExit('loaded')\n")
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[step]]\nname = "prune"\nratio = 0.5\n[[step]]\nname = "distill"\nepochs = 10\n'
                      '[[step]]\nname = "int8"\npreset = "bogus"\n')
    run = subprocess.run([str(Path(sys.executable).parent / "edgeopt"), "compress",
                          f"{factory}:build", "--calib", str(tiny_calib), "--recipe", str(recipe),
                          "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "step 3" in lines[0] and "int8: preset must be one of auto, performance, mixed" in lines[0]
    assert not marker.exists() and not (tmp_path / "out").exists()

"""Device profiles: the shipped ones, the strict schema, inheritance, emulation decisions and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeopt.device.budgets import BUDGET_FIELDS
from edgeopt.device.host import HostInfo
from edgeopt.errors import BadInputError
from edgeopt.targets import list_targets, load_target, onednn_isa, plan_emulation

ROOT = Path(__file__).resolve().parents[1]

VALID = """
extends = "base-x86"
description = "test box"

[device]
name = "test box"
cpu = "test CPU"
cores = 2
memory_mb = 2048

[runtime]
threads = 2

[budgets]
max_file_mb = 10
max_peak_rss_mb = 500
p50_ms = 5
p95_ms = 10
p99_ms = 20
"""


def host(machine="x86_64", cpu="AMD EPYC", cpus=2, flags=("avx2", "avx512f")) -> HostInfo:
    return HostInfo(cpu_model=cpu, logical_cpus=cpus, usable_cpus=cpus, memory_bytes=None, os="Linux",
                    machine=machine, python="3.11", cpu_flags=flags)


def test_shipped_profiles_are_complete_and_sourced():
    targets = {t.name: t for t in list_targets()}
    devices = ("raspberry-pi-4", "raspberry-pi-5", "intel-n100", "intel-core-i7-1165g7", "jetson-orin-nano-cpu",
               "generic-x86-avx2-2core")
    assert set(devices) <= set(targets)
    for target in targets.values():
        assert set(target.budgets.describe()) == set(BUDGET_FIELDS), target.name
        assert target.precisions and target.settings.threads and target.extends
    for name in devices:
        text = targets[name].source.read_text()
        assert "Source" in text and "https://" in text, f"{name}: the device's figures need a source"
    assert "base-x86" not in targets and "base-arm64" not in targets  # abstract bases are not devices
    assert targets["raspberry-pi-4"].device.cores == 4 and targets["raspberry-pi-4"].settings.inference_precision == "f32"
    assert targets["raspberry-pi-5"].settings.inference_precision == "f16"
    assert targets["jetson-orin-nano-cpu"].device.cores == 6
    ort = targets["raspberry-pi-5-onnxruntime"]  # the same board, run by ONNX Runtime
    assert ort.settings.runtime == "onnxruntime" and ort.device == targets["raspberry-pi-5"].device
    assert ort.budgets == targets["raspberry-pi-5"].budgets and ort.precisions == ("int8", "fp32")


def test_extends_merges_key_by_key(profiles):
    profiles("child", VALID + '\n[model]\nprecisions = ["int8"]\ninput_shapes = { input = [1, 3, 8, 8] }\n')
    target = load_target("child")
    assert target.extends == ("base-x86",)
    assert target.settings.threads == 2  # from the child
    assert target.settings.inference_precision == "f32" and target.settings.performance_hint == "LATENCY"  # base
    assert target.device.arch == "x86_64"  # base [device] merged under the child's
    assert target.budgets.max_cv == 0.5 and target.budgets.p50_ms == 5.0  # base + child budgets
    assert target.precisions == ("int8",) and target.input_shapes == {"input": (1, 3, 8, 8)}
    grandchild = profiles("grandchild", 'extends = "child"\n[runtime]\nthreads = 1\n')
    assert load_target(grandchild).extends == ("child", "base-x86")
    assert load_target(str(grandchild)).settings.threads == 1


@pytest.mark.parametrize("edit, key, words", [
    (("p99_ms = 20", "p99_ms = 20\np999_ms = 40"), "budgets.p999_ms", "unknown key"),
    (("[runtime]", "colour = 'red'\n[runtime]"), "colour", "unknown key"),
    (("threads = 2", 'threads = "two"'), "runtime.threads", "must be an integer"),
    (("p50_ms = 5", 'p50_ms = "fast"'), "budgets.p50_ms", "must be a number"),
    (("p50_ms = 5", "p50_ms = true"), "budgets.p50_ms", "must be a number"),
    (("p95_ms = 10\n", ""), "budgets.p95_ms", "missing budget"),
    (("cores = 2", "cores = 0"), "device.cores", "at least 1"),
    (("threads = 2", 'threads = 2\nname = "tensorrt"'), "runtime.name", "must be one of"),
    (("threads = 2", 'threads = 2\ninference_precision = "int4"'), "runtime.inference_precision", "must be one of"),
    (("p50_ms = 5", "p50_ms = -5"), "p50_ms", "positive number"),
    (("threads = 2", "threads = 2\nspinning = false"), "runtime.spinning", "ONNX Runtime only"),
    (("threads = 2", 'threads = 2\nname = "onnxruntime"\nspinning = "no"'), "runtime.spinning", "must be"),
])
def test_schema_errors_name_the_file_and_the_key(profiles, edit, key, words):
    path = profiles("broken", VALID.replace(*edit))
    with pytest.raises(BadInputError) as info:
        load_target("broken")
    message = str(info.value)
    assert str(path) in message and key in message and words in message, message


def test_missing_budget_says_where_it_was_looked_for(profiles):
    profiles("nobudget", VALID.replace("p99_ms = 20\n", ""))
    with pytest.raises(BadInputError, match=r"nobudget\.toml: missing budget 'budgets\.p99_ms' \(not set here nor in "
                                            r"base-x86\)"):
        load_target("nobudget")


def test_bad_extends_and_toml(profiles):
    profiles("a", 'extends = "b"\ndescription = "a"\n')
    profiles("b", 'extends = "a"\ndescription = "b"\n')
    with pytest.raises(BadInputError, match="cycle"):
        load_target("a")
    profiles("orphan", VALID.replace("base-x86", "no-such-base"))
    with pytest.raises(BadInputError, match="orphan.toml: extends: no base profile named 'no-such-base'"):
        load_target("orphan")
    profiles("garbled", "description = \n")
    with pytest.raises(BadInputError, match="garbled.toml: not valid TOML"):
        load_target("garbled")
    with pytest.raises(BadInputError, match="abstract base"):
        load_target("base-x86")
    with pytest.raises(BadInputError, match="unknown target 'nope'.*generic-x86-avx2-2core"):
        load_target("nope")


def test_emulation_is_planned_and_said():
    pi4 = load_target("raspberry-pi-4")
    assert plan_emulation(pi4, host("aarch64", "Cortex-A72", 4)) is None  # this host is the device
    emulation = plan_emulation(pi4, host())
    assert emulation.settings.threads == 2 and len(emulation.cpus) == 2  # the host's 2 CPUs, not the Pi's 4
    assert "the profile runs 4 threads but this host has 2 CPUs: latency reads higher" in emulation.note
    assert emulation.note.startswith("emulated on ") and "(AMD EPYC)" in emulation.note
    assert "aarch64" in emulation.note and emulation.max_isa is None
    n100 = plan_emulation(load_target("intel-n100"), host())
    assert n100.max_isa == "AVX2_VNNI" and "ISA capped to AVX2_VNNI" in n100.note
    generic = load_target("generic-x86-avx2-2core")
    assert not generic.is_host(host(cpu="anything", cpus=64))  # a generic profile is always emulated
    assert onednn_isa(("avx2",)) == "AVX2"
    assert onednn_isa(("avx2", "avx512f", "avx512_vnni")) == "AVX512_CORE_VNNI"
    assert onednn_isa(()) == "SSE41"


def test_cli_list_and_show(cli, profiles):
    result = cli("targets", "list")
    assert result.exit_code == 0 and "raspberry-pi-4" in result.output and "emulated" in result.output
    listed = json.loads(cli("targets", "list", "--json").output)
    assert {"raspberry-pi-5", "intel-n100"} <= {t["name"] for t in listed}
    shown = json.loads(cli("targets", "show", "generic-x86-avx2-2core", "--json").output)
    assert shown["runtime"]["threads"] == 2 and shown["extends"] == ["base-x86"]
    assert shown["emulation_note"].startswith("emulated on")
    result = cli("targets", "show", "raspberry-pi-5")
    assert result.exit_code == 0 and "Cortex-A76" in result.output and "p99_ms" in result.output


def test_cli_bad_profile_is_one_line_exit_2(cli, profiles):
    path = profiles("broken", VALID.replace("p99_ms = 20", "p99_ms = 20\nlatency = 3"))
    result = cli("targets", "show", "broken")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"edgeopt: {path}: unknown key 'budgets.latency' (known: " \
                                    f"{', '.join('budgets.' + k for k in BUDGET_FIELDS)})"
    assert "Traceback" not in result.output


def test_objective_is_profile_data(profiles):
    path = profiles("fits", VALID + '[model]\nprecisions = ["int8"]\nobjective = "file_mb"\n')
    assert load_target(path).objective == "file_mb"
    bad = profiles("bad", VALID + '[model]\nprecisions = ["int8"]\nobjective = "fastest"\n')
    with pytest.raises(BadInputError, match="'model.objective' must be one of"):
        load_target(bad)


@pytest.mark.parametrize("spinning", [False, True])
def test_onnx_runtime_spinning_is_profile_data_and_reaches_the_session(profiles, tiny_onnx, spinning):
    """ONNX Runtime's intra-op threads spin while they wait unless told not to (``session.intra_op.allow_spinning``):
    on small models that wait is a large share of a run, so a device's profile says which it deploys with."""
    from edgeopt.device.runtime import open_session

    setting = f'threads = 2\nname = "onnxruntime"\nspinning = {str(spinning).lower()}'
    profiles("ort", VALID.replace("threads = 2", setting))
    settings = load_target("ort").settings
    assert settings.spinning is spinning and settings.describe()["spinning"] is spinning
    session = open_session(tiny_onnx, settings)
    assert session.effective_settings()["spinning"] is spinning
    options = session._session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == str(int(spinning))
    assert open_session(tiny_onnx).effective_settings()["spinning"] is True  # ONNX Runtime's default


def test_fp32_comparisons_run_the_way_the_profile_runs(profiles):
    """The INT8-vs-FP32 timing (``vs_fp32``, and the ONNX backend race) takes the profile's threads (at most this
    host's CPUs) and ONNX Runtime's spinning for the runtime the profile names; otherwise the pinned 2 threads."""
    import os

    from edgeopt.vs_fp32 import THREADS, settings_for

    profiles("ort", VALID.replace("threads = 2", 'threads = 1\nname = "onnxruntime"\nspinning = false'))
    ort = load_target("ort")
    assert (settings_for("onnxruntime", ort).threads, settings_for("onnxruntime", ort).spinning) == (1, False)
    assert settings_for("openvino", ort) == settings_for("openvino")  # the profile says nothing of OpenVINO here
    assert settings_for("onnxruntime").threads == THREADS and settings_for("onnxruntime").spinning is None
    profiles("wide", VALID.replace("threads = 2", "threads = 64"))
    wide = settings_for("openvino", load_target("wide"))
    assert wide.threads == min(64, len(os.sched_getaffinity(0))) and wide.inference_precision == "f32"  # pinned


def test_a_profile_can_switch_its_base_runtime(profiles):
    """TOML cannot unset a key, so a profile that extends an ONNX Runtime profile and runs OpenVINO instead does
    not inherit ONNX Runtime's own settings (spinning); set in the profile itself, they are still refused."""
    profiles("ort", VALID.replace("threads = 2", 'threads = 2\nname = "onnxruntime"\nspinning = false'))
    switched = profiles("ov", 'extends = "ort"\n[runtime]\nname = "openvino"\n')
    settings = load_target(switched).settings
    assert settings.runtime == "openvino" and settings.spinning is None
    assert load_target(profiles("ort-child", 'extends = "ort"\n[runtime]\nthreads = 1\n')).settings.spinning is False
    both = profiles("both", 'extends = "ort"\n[runtime]\nname = "openvino"\nspinning = true\n')
    with pytest.raises(BadInputError, match="'runtime.spinning' is an ONNX Runtime setting"):
        load_target(both)


def test_an_unknown_input_in_a_profiles_input_shapes_is_named_as_the_profiles(cli, profiles, tiny_factory, tiny_calib,
                                                                                tmp_path):
    """A profile's ``[model] input_shapes`` naming an input the model lacks: the error names the profile, not
    ``--input-shape``, which the user did not give."""
    profiles("shaped", 'extends = "generic-x86-avx2-2core"\ndescription = "for another model"\n\n[model]\n'
                       "input_shapes = { images = [1, 3, 8, 8] }\n")
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--target", "shaped", "--out", tmp_path / "o")
    assert result.exit_code == 2, result.output
    assert "target shaped's [model] input_shapes names unknown input(s) images" in result.output, result.output
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--target", "shaped", "--input-shape", "x=1,1,8,8",
                 "--out", tmp_path / "o2")
    said = "--input-shape or target shaped's [model] input_shapes names unknown input(s) images"
    assert result.exit_code == 2 and said in result.output, result.output


def test_a_target_without_format_writes_the_format_it_runs(cli, tiny_factory, tiny_calib, tmp_path):
    """``--target raspberry-pi-5-onnxruntime`` without ``--format``: only the ONNX file, the one that target runs,
    gated and measured (an IR failing the gate made the run exit 3 with the ONNX file passing); the note says how
    to get both."""
    out = tmp_path / "o"
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--eval", tiny_calib, "--target",
                 "raspberry-pi-5-onnxruntime", "--out", out)
    assert result.exit_code in (0, 4), result.output  # 4: an emulated budget may fail on a busy host
    assert (out / "model.onnx").exists() and not list(out.glob("*.xml"))
    report = json.loads((out / "report.json").read_text())
    assert list(report["quality"]["artifacts"]) == ["onnx"]
    assert any("not written: target raspberry-pi-5-onnxruntime runs onnxruntime (--format openvino,onnx writes both)"
               in note for note in report["notes"]), report["notes"]
    said = "target raspberry-pi-5-onnxruntime runs onnxruntime, which reads ONNX files; "
    for formats in ((), ("--format", "onnx"), ("--format", "openvino"), ("--format", "openvino,onnx")):
        result = cli("compress", tiny_factory, "--calib", tiny_calib, "--eval", tiny_calib, "--target",
                     "raspberry-pi-5-onnxruntime", "--repair", *formats, "--out", tmp_path / "r")  # IR only
        assert result.exit_code == 2 and said + "int8_repair writes OpenVINO IR only" in result.output, result.output
    ir = tmp_path / "ir"
    assert cli("compress", tiny_factory, "--calib", tiny_calib, "--format", "openvino", "--out", ir).exit_code == 0
    result = cli("compress", ir / "model.xml", "--calib", tiny_calib, "--target", "raspberry-pi-5-onnxruntime",
                 "--out", tmp_path / "from-ir")
    assert result.exit_code == 2 and said + "an OpenVINO IR source is written as OpenVINO IR only" in result.output

"""`edgeopt optimize` end to end: real NNCF, OpenVINO and measurements, few timed runs, a per-test cache."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DIGITS_CALIB, DIGITS_EVAL, DIGITS_MODEL
from edgeopt.device.runtime import open_session, random_feeds
from edgeopt.errors import BadInputError
from edgeopt.optimization.plan import load_plan

FEW_RUNS = ("--runs", "30", "--warmup", "5", "--min-seconds", "0")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def optimize(*args):
    from edgeopt.cli import main

    return CliRunner().invoke(main, ["optimize", *map(str, args), *FEW_RUNS], catch_exceptions=False)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The digits sample optimized for digits-tight (its 350 KB file budget rules out FP32 and FP16)."""
    root = tmp_path_factory.mktemp("optimize-digits")
    out, cache = root / "out", root / "cache"
    result = optimize(DIGITS_MODEL, "--target", "digits-tight", "--calib", DIGITS_CALIB, "--eval", DIGITS_EVAL,
                      "--out", out, "--cache", cache)
    return result, out, cache, json.loads((out / "report.json").read_text())


def test_digits_tight_finds_a_passing_artifact_that_loads(digits):
    result, out, _, report = digits
    assert result.exit_code == 0, result.output
    assert report["verdict"] == "found"
    by_label = {c["label"]: c for c in report["candidates"]}
    chosen = by_label[report["chosen"]]
    assert chosen["passed"] and all(check["passed"] for check in chosen["checks"])
    assert chosen["precision"] in report["target"]["precisions"]
    # the baseline was measured first and missed the file budget; the search stopped once something passed
    assert report["candidates"][0]["label"] == "fp32"
    assert [c["name"] for c in by_label["fp32"]["checks"] if not c["passed"]] == ["max_file_mb"]
    assert report["stages_run"] == ["baseline", "cheap wins"]
    # every candidate that passed is at least as slow as the chosen one (modulo the documented 3% tie band)
    passing = [c for c in report["candidates"] if c["passed"]]
    assert all(chosen["figures"]["p50_ms"] <= c["figures"]["p50_ms"] * 1.03 for c in passing)
    session = open_session(out / "model.xml")
    logits = session.infer(random_feeds(session.static_inputs))[0]
    assert logits.shape == (1, 10) and np.isfinite(logits).all()
    assert re.search(r"★ " + re.escape(report["chosen"]), result.output)
    assert "FOUND" in result.output and "emulated on" in result.output


def test_the_folder_optimize_wrote_packages_with_its_choice_s_compress_report(digits, tmp_path, cli):
    """``package out/`` after ``optimize``: the chosen artifact's compress report comes from the cache entry that
    built it (quality gate, recipe, provenance); a file in out/ that is not the one chosen is refused."""
    from bundle_support import FAST, LOOSE_TAIL, LOOSE_TARGET

    from edgeopt.device.bundle_reader import open_bundle

    _, out, cache, report = digits
    target = tmp_path / "loose.toml"
    target.write_text(LOOSE_TARGET.format(runtime="openvino") + LOOSE_TAIL.split("[model]")[0])
    result = cli("package", out, "--target", target, "--out", tmp_path / "b.tar.gz", *FAST)
    assert result.exit_code == 0, result.output
    manifest = open_bundle(tmp_path / "b.tar.gz").manifest
    chosen = next(c for c in report["candidates"] if c["label"] == report["chosen"])
    assert manifest["recipe"] == chosen["recipe"] and manifest["quality"]
    result = cli("package", out / "model.xml", "--target", target, "--out", tmp_path / "f.tar.gz", *FAST)
    assert result.exit_code == 0, result.output  # one file of it: the same report
    assert open_bundle(tmp_path / "f.tar.gz").manifest["recipe"] == chosen["recipe"]
    copied = tmp_path / "copied"
    shutil.copytree(out, copied)
    (copied / "model.bin").write_bytes((copied / "model.bin").read_bytes()[:-4] + b"\0\0\0\0")
    result = cli("package", copied, "--target", target, "--out", tmp_path / "c.tar.gz", *FAST)
    assert result.exit_code == 2 and "not the file optimize chose" in result.output, result.output


def test_rerun_reuses_cached_artifacts_and_measurements(digits, tmp_path):
    _, _, cache, first = digits
    out = tmp_path / "again"
    result = optimize(DIGITS_MODEL, "--target", "digits-tight", "--calib", DIGITS_CALIB, "--eval", DIGITS_EVAL,
                      "--out", out, "--cache", cache, "--json", tmp_path / "report.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    built = [c for c in report["candidates"] if not c["skipped"]]
    assert built and all(c["reused"] == {"artifact": True, "measurement": True} for c in built)
    assert "reused" in result.output
    assert report["chosen"] == first["chosen"]
    assert [c["figures"] for c in built] == [c["figures"] for c in first["candidates"] if not c["skipped"]]


def test_a_spread_read_unreliable_on_a_busy_host_stays_unreliable_when_reused(digits, tmp_path):
    """validate_on measures a failed spread twice on a busy host and reads it UNRELIABLE (passing); optimize
    re-judges cached figures against the profile's budgets and must keep that verdict, not turn it into FAIL."""
    from edgeopt.optimization.cache import Cache

    _, _, built, first = digits
    cache_dir = tmp_path / "cache"
    shutil.copytree(built, cache_dir)
    cache = Cache(cache_dir)
    for measured in sorted(cache_dir.glob("*/measure-*.json")):
        key, measure_key = measured.parent.name, measured.stem.removeprefix("measure-")
        data = cache.load_measurement(key, measure_key)
        data["figures"]["cv"] = 25.0  # digits-tight allows 20
        for check in data["validation"]["checks"]:
            if check["name"] == "max_cv":
                check.update(status="unreliable", passed=True, measured=25.0)
        cache.store_measurement(key, measure_key, data)
    out = tmp_path / "again"
    result = optimize(DIGITS_MODEL, "--target", "digits-tight", "--calib", DIGITS_CALIB, "--eval", DIGITS_EVAL,
                      "--out", out, "--cache", cache_dir)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["chosen"] == first["chosen"]
    spreads = [check for c in report["candidates"] for check in c["checks"] if check["name"] == "max_cv"]
    assert spreads and all(check["verdict"] == "UNRELIABLE" and check["passed"] for check in spreads)


def test_reports_are_written_and_well_formed(digits):
    _, out, _, report = digits
    from conftest import report_schema_errors

    from edgeopt.reporting.reports import OptimizeReport

    assert report_schema_errors(report) == [] and OptimizeReport.from_dict(report).to_dict() == report
    assert OptimizeReport.from_dict(OptimizeReport.from_dict(report).to_dict()) == OptimizeReport.from_dict(report)
    for name in ("latency.png", "tradeoff.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# edgeopt optimize — digits-tight")
    assert "![latency histograms](latency.png)" in markdown
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    widths = {len(line) for line in table[:len(report["candidates"]) + 2]}
    assert len(widths) == 1  # the candidates table lines up in a terminal
    for candidate in report["candidates"]:
        assert f" {candidate['label']} " in markdown or f"★ {candidate['label']} " in markdown
    assert "FAIL 0.9" in markdown and "PASS" in markdown  # the FP32 IR's size, per budget
    assert "quality vs original" in markdown and "top-1 drop " in markdown  # labelled digits: the top-1 drop
    assert "emulated on" in markdown and report["host"]["cpu_model"] in markdown

    parser = _Html()
    parser.feed((out / "report.html").read_text())
    assert parser.stack == []  # every element closed
    assert len(parser.images) == 2
    for src in parser.images:
        assert base64.b64decode(src.removeprefix("data:image/png;base64,")).startswith(PNG_MAGIC)
    assert {"chosen", "fail"} <= parser.row_classes


def test_report_renders_in_headless_chromium(digits, tmp_path):
    _, out, _, _ = digits
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (./dev setup installs Debian's package when run as root)")
    shot = tmp_path / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1280,2000",
                        (out / "report.html").as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.is_file(), "chromium wrote no screenshot"
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1280, 2000)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is None or len(colours) > 50  # text, tables and plots, not a blank page


def test_impossible_profile_exits_4_naming_the_closest_candidate(tiny_factory, tiny_calib, tmp_path, profiles):
    profiles("digits-impossible", 'extends = "digits-tight"\ndescription = "a 0.1 µs median: nothing can meet it"\n'
             "[budgets]\np50_ms = 0.0001\n")
    out = tmp_path / "out"
    result = optimize(tiny_factory, "--target", "digits-impossible", "--calib", tiny_calib, "--eval", tiny_calib,
                      "--out", out, "--cache", tmp_path / "cache")
    assert result.exit_code == 4, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "budgets" and report["chosen"] is None
    closest = report["closest"]
    assert re.search(rf"closest: {re.escape(closest)} .*fails .*p50_ms", result.stderr)
    measured = [c for c in report["candidates"] if c["checks"]]
    assert len(measured) >= 3  # baseline and the cheap wins, at least
    assert all("p50_ms" in [ch["name"] for ch in c["checks"] if not ch["passed"]] for c in measured)
    assert report["stages_run"][-1] == load_plan()[-1].name  # it tried every stage before giving up
    assert "NO CANDIDATE MEETS EVERY BUDGET" in (out / "report.md").read_text()
    assert f"◆ {closest}" in (out / "report.md").read_text()
    assert not list(out.glob("*.xml"))


def test_a_passing_baseline_still_tries_the_cheap_wins(tiny_factory, tiny_calib, tmp_path, profiles):
    """FP32 meeting every budget is no reason to stop: the fastest passing precision is chosen, measured."""
    profiles("roomy", 'extends = "digits-tight"\ndescription = "everything fits"\n[budgets]\nmax_file_mb = 50\n')
    result = optimize(tiny_factory, "--target", "roomy", "--calib", tiny_calib, "--eval", tiny_calib, "--out",
                      tmp_path / "out", "--cache", tmp_path / "cache", "--max-drop", "100")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    by_label = {c["label"]: c for c in report["candidates"]}
    assert by_label["fp32"]["passed"]
    assert report["stages_run"] == ["baseline", "cheap wins"]
    passing = [c for c in report["candidates"] if c["passed"]]
    assert {c["label"] for c in passing} >= {"fp32", "int8"}
    chosen = by_label[report["chosen"]]
    assert all(chosen["figures"]["p50_ms"] <= c["figures"]["p50_ms"] * 1.03 for c in passing)


def test_nothing_within_the_gate_exits_3(tiny_factory, tmp_path, profiles):
    """Without labels the gate compares outputs; a cosine of 1.0 cannot be met by any INT8 model."""
    rng = np.random.default_rng(1)
    data = tmp_path / "unlabelled.npz"
    np.savez(data, input=rng.random((32, 1, 8, 8), dtype=np.float32))
    profiles("int8-only", 'extends = "digits-tight"\ndescription = "INT8 only"\n[model]\nprecisions = ["int8"]\n')
    plan = tmp_path / "plan.toml"
    plan.write_text('[[stage]]\nname = "baseline"\n[[stage.candidate]]\nlabel = "fp32"\nprecision = "fp32"\n'
                    'steps = []\n[[stage]]\nname = "cheap"\n[[stage.candidate]]\nlabel = "int8"\n'
                    'precision = "int8"\nsteps = [{ name = "int8" }]\n')
    result = optimize(tiny_factory, "--target", "int8-only", "--calib", data, "--eval", data, "--out",
                      tmp_path / "out", "--cache", tmp_path / "cache", "--plan", plan, "--min-cosine", "1.0")
    assert result.exit_code == 3, result.output
    assert "quality gate" in result.stderr and "int8: cosine" in result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "quality"
    assert not report["candidates"][0]["eligible"]  # the baseline is measured, but the device has no fp32


def test_bad_input_exits_2(cli, tiny_factory, tiny_calib, tmp_path):
    result = cli("optimize", tiny_factory, "--target", "no-such-device", "--calib", tiny_calib, "--eval", tiny_calib,
                 "--out", tmp_path / "out")
    assert result.exit_code == 2 and "unknown target" in result.stderr
    plan = tmp_path / "plan.toml"
    plan.write_text('[[stage]]\nname = "x"\nbogus = 1\n[[stage.candidate]]\nlabel = "a"\nprecision = "fp32"\n'
                    "steps = []\n")
    result = cli("optimize", tiny_factory, "--target", "digits-tight", "--calib", tiny_calib, "--eval", tiny_calib,
                 "--out", tmp_path / "out", "--plan", plan)
    assert result.exit_code == 2 and "unknown key(s) bogus" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_default_plan_follows_the_careful_order(tmp_path):
    stages = load_plan()
    assert [s.name for s in stages][:3] == ["baseline", "cheap wins", "accuracy-controlled INT8"]
    labels = [c.label for s in stages for c in s.candidates]
    assert labels.index("fp16") < labels.index("int8") < labels.index("int8-repair") < labels.index("weights")
    assert stages[-1].candidates[-1].recipe.names[:2] == ["prune", "distill"]
    bad = tmp_path / "plan.toml"
    bad.write_text('[[stage]]\nname = "a"\n[[stage.candidate]]\nlabel = "x"\nprecision = "fp32"\nsteps = []\n'
                   '[[stage.candidate]]\nlabel = "x"\nprecision = "int8"\nsteps = []\n')
    with pytest.raises(BadInputError, match="used twice"):
        load_plan(bad)


class _Html(HTMLParser):
    """Checks nesting of non-void elements; collects image sources and table row classes."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__()
        self.stack, self.images, self.row_classes = [], [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        if tag == "tr" and attrs.get("class"):
            self.row_classes.add(attrs["class"])
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()


def test_cache_keys_follow_edgeopt_source_not_only_its_version(tmp_path):
    """A development build keeps version 0.1.0 while its code changes; the source digest keys caches and reports."""
    from edgeopt.versions import source_digest, tool_versions, tree_digest

    assert tool_versions()["edgeopt-source"] == source_digest()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "notes.txt").write_text("ignored\n")
    before = tree_digest(tmp_path / "pkg")
    (tmp_path / "pkg" / "notes.txt").write_text("still ignored\n")
    assert tree_digest(tmp_path / "pkg") == before
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert tree_digest(tmp_path / "pkg") != before


def test_a_step_that_cannot_write_the_device_s_format_is_skipped_with_why(profiles):
    """An ONNX Runtime device gets ONNX files: the plan's IR-only repair is skipped with a reason, not built to
    fail (rapid-layout's optimize for an ONNX Runtime profile printed "build failed")."""
    from edgeopt.optimization.plan import DEFAULT_PLAN
    from edgeopt.optimization.search import _skip_reason
    from edgeopt.targets import load_target

    profiles("ort-box", 'extends = "generic-x86-avx2-2core"\n[runtime]\nname = "onnxruntime"\n')
    target = load_target("ort-box")
    repair = next(c for stage in load_plan(DEFAULT_PLAN) for c in stage.candidates if c.label == "int8-repair")
    assert _skip_reason(repair, target, "onnx", []) == ("step 'int8_repair' writes openvino only, and ort-box runs "
                                                        "onnx (onnxruntime)")
    assert _skip_reason(repair, load_target("generic-x86-avx2-2core"), "onnx", []) != _skip_reason(repair, target,
                                                                                                   "onnx", [])


def test_no_candidate_built_is_bad_input_not_quality(tiny_calib, tmp_path):
    """A factory that works once per process (it leaves the process in a state its second call trips on): every
    candidate's build fails, which is the model's fault, not a quality verdict: exit 2 naming why, not exit 3."""
    factory = tmp_path / "once.py"
    factory.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import torch\n"
        "from conftest import TinyNet\n"
        "def build():\n"
        "    if getattr(sys, '_edgeopt_test_built', False):\n"
        "        raise RuntimeError('the pitch model registers itself once per process')\n"
        "    sys._edgeopt_test_built = True\n"
        "    return TinyNet().eval(), torch.zeros(1, 1, 8, 8)\n")
    try:
        result = optimize(f"{factory}:build", "--target", "digits-tight", "--calib", tiny_calib, "--eval", tiny_calib,
                          "--out", tmp_path / "out", "--cache", tmp_path / "cache")
    finally:
        sys._edgeopt_test_built = False
    assert result.exit_code == 2, result.output
    assert "no candidate could be built" in result.stderr and "registers itself once per process" in result.stderr
    assert json.loads((tmp_path / "out" / "report.json").read_text())["verdict"] == "unbuilt"
    assert "NO CANDIDATE COULD BE BUILT" in (tmp_path / "out" / "report.md").read_text()  # as the exit says

"""`edgeopt fleet` on the local executor: the fleet file's schema, a small real fleet (digits × two targets),
its matrix report, JUnit, bundles, exit code, measurement slots, and a re-run taken from the cache."""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from fleet_support import chosen_files, write_fleet
from edgeopt.fleet.run import worst
from edgeopt.fleet.slots import SlotEvent, overlaps


def fleet(*args):
    from edgeopt.cli import main

    return CliRunner().invoke(main, ["fleet", *map(str, args)], catch_exceptions=False)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("[settings]", "[settings]\nthreads = 2"), "[settings]: unknown key(s) threads"),
    (lambda t: t.replace('name = "digits"\n', ""), "missing key(s) name"),
    (lambda t: t.replace('recipe = "int8.toml"', 'recipe = "int8.toml"\nplan = "int8.toml"'), "a plan or a recipe"),
    (lambda t: t.replace('recipe = "int8.toml"', 'recipe = "missing.toml"'), "recipe 'missing.toml': no such file"),
    (lambda t: t.replace("runs = 30", 'runs = "many"'), "runs must be an integer"),
    (lambda t: t + '[[target]]\nprofile = "digits-tight"\nname = "tight"\n', "target name(s) used twice: tight"),
    (lambda t: t.replace('name = "digits"', 'name = "../up"'), "must be 1-64 letters"),
    (lambda t: t.replace("[[target]]", "[[target]]\ncolour = 1", 1), "unknown key(s) colour"),
])
def test_a_bad_fleet_file_is_one_line_and_exit_2(tmp_path, edit, message):
    path = write_fleet(tmp_path, models=("digits",))
    path.write_text(edit(path.read_text()))
    result = fleet(path, "--out", tmp_path / "out", "--cache", tmp_path / "cache")
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_unknown_executor_is_bad_input(tmp_path):
    path = write_fleet(tmp_path, models=("digits",))
    result = fleet(path, "--out", tmp_path / "out", "--executor", "dask")
    assert result.exit_code == 2 and "--executor must be local, ray or ray=ADDRESS" in result.output


def test_an_unreachable_ray_address_is_bad_input_at_once(tmp_path):
    """Refused before Ray is imported: Ray reads its authentication settings once, at import, so importing it in
    this process before test_fleet_ray's cluster sets them made every later driver join without a token."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = write_fleet(tmp_path, models=("digits",))
    result = fleet(path, "--out", tmp_path / "out", "--executor", f"ray=127.0.0.1:{port}")
    assert result.exit_code == 2, result.output
    assert "no Ray cluster answers there" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_worst_pair_decides_the_exit_code():
    assert worst([0, 4, 0]) == 4 and worst([4, 3]) == 3 and worst([3, 5]) == 5 and worst([5, 2, 4]) == 2
    assert worst([2, 1]) == 1 and worst([]) == 0


def test_overlaps_finds_a_measurement_beside_a_build_on_the_same_machine():
    def event(kind, host, start, end):
        return SlotEvent("p", "c", kind, host, "n", 1, start, end, 0.0, 0.0, 2)

    build = event("build", "a", 0.0, 10.0)
    assert overlaps([build, event("measure", "a", 10.0, 11.0), event("measure", "b", 5.0, 6.0)]) == []
    assert len(overlaps([build, event("measure", "a", 9.0, 11.0)])) == 1


@pytest.fixture(scope="module")
def digits_fleet(tmp_path_factory):
    """digits × (digits-tight, and digits-tight again as "small" with a 100 KB budget): one pass, one miss."""
    root = tmp_path_factory.mktemp("fleet")
    path = write_fleet(root, models=("digits",), targets=("tight", "small"))
    (root / "small.toml").write_text('extends = "digits-tight"\n[budgets]\nmax_file_mb = 0.1\n')
    path.write_text(path.read_text().replace('profile = "digits-tight"\nname = "small"', 'profile = "small.toml"'))
    first = fleet(path, "--out", root / "out", "--cache", root / "cache")
    report = json.loads((root / "out" / "report.json").read_text())
    (root / "first").mkdir()
    (root / "first" / "report.json").write_text(json.dumps(report))
    # into the same --out: edgeopt recognises its own fleet output and replaces it
    again = fleet(path, "--out", root / "out", "--cache", root / "cache", "--json", root / "again.json")
    return root, first, report, again


def test_a_fleet_writes_each_pair_and_a_matrix_with_the_worst_exit_code(digits_fleet):
    root, first, report, _ = digits_fleet
    assert first.exit_code == 4, first.output  # the "small" pair misses its file budget
    assert report["report"] == "fleet" and report["exit_code"] == 4 and report["executor"]["name"] == "local"
    pairs = {p["target"]: p for p in report["pairs"]}
    assert pairs["tight"]["verdict"] == "found" and pairs["tight"]["exit_code"] == 0
    assert pairs["small"]["verdict"] == "budgets" and "max_file_mb" in pairs["small"]["why"]
    out = root / "out"
    assert set(pairs["tight"]["chosen_files"]) == {"model.xml", "model.bin"}
    assert (out / "digits" / "tight" / "model.xml").is_file() and (out / "digits" / "tight" / "report.md").is_file()
    assert pairs["tight"]["bundle"] == "digits/tight/bundle.tar.gz" and (out / pairs["tight"]["bundle"]).is_file()
    assert pairs["small"]["bundle"] is None and not (out / "digits" / "small" / "model.xml").exists()
    markdown = (out / "report.md").read_text()
    assert "| digits" in markdown and "FAIL (budgets): closest" in markdown and "PASS: digits" in markdown
    # the final summary on stdout: one line per pair and the totals, then the one-line error
    assert "1/2 pairs pass" in first.output and "measurement slots held" in first.output
    assert "edgeopt: 1 of 2 pairs fail; worst: digits × small" in first.output


def test_the_junit_has_one_case_per_pair(digits_fleet):
    root = digits_fleet[0]
    suite = ET.parse(root / "out" / "junit.xml").getroot().find("testsuite")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert set(cases) == {"tight", "small"} and suite.get("tests") == "2" and suite.get("failures") == "1"
    assert cases["tight"].find("failure") is None
    assert "max_file_mb" in cases["small"].find("failure").get("message")


def test_every_build_and_measurement_is_recorded_and_no_measurement_overlaps_a_build(digits_fleet):
    report = digits_fleet[2]
    events = report["events"]
    assert [e["kind"] for e in events].count("build") == 2 and [e["kind"] for e in events].count("measure") == 2
    assert report["slot_overlaps"] == 0
    assert all(e["end"] >= e["start"] and e["load_1min"] >= 0 and e["cpus"] >= 1 for e in events)
    for measure in (e for e in events if e["kind"] == "measure"):
        assert not any(b["start"] < measure["end"] and measure["start"] < b["end"]
                       for b in events if b["kind"] == "build")


def test_a_rerun_takes_every_pair_from_the_cache_with_the_same_artifacts(digits_fleet):
    root, _, report, again = digits_fleet
    assert again.exit_code == 4
    second = json.loads((root / "again.json").read_text())
    assert second["events"] == []  # nothing built or measured again
    assert all(p["reused"] == p["candidates"] == 1 for p in second["pairs"])
    assert chosen_files(root / "out") == chosen_files(root / "first")
    assert (root / "out" / "digits" / "tight" / "bundle.tar.gz").is_file()


"""Typed, versioned reports, and the library doing what the command line does with a target."""

from __future__ import annotations

import json

from bundle_support import loose_target
from conftest import report_schema_errors

import edgeopt
from edgeopt.device.validate import ValidationReport
from edgeopt.reporting.reports import CompressReport, OptimizeReport
from edgeopt.targets import Measuring, load_target


def test_python_compress_with_a_target_does_what_cli_target_does(cli, tiny_factory, tiny_calib, tmp_path_factory,
                                                                   tmp_path):
    profile = loose_target(tmp_path_factory)
    result = edgeopt.compress(tiny_factory, tiny_calib, out=tmp_path / "api", target=str(profile),
                              measuring=Measuring(runs=20, warmup=2, min_seconds=0))
    run = cli("compress", tiny_factory, "--calib", tiny_calib, "--target", profile, "--out", tmp_path / "cli",
              "--validate-runs", 20, "--validate-seconds", 0)
    assert run.exit_code == 0, run.output
    assert "measured with:" in run.output and "PASS" in run.output  # the budget table follows the artifacts
    api = json.loads((tmp_path / "api" / "report.json").read_text())
    via_cli = json.loads((tmp_path / "cli" / "report.json").read_text())
    target = load_target(profile)
    assert result.target == target and result.recipe.names == [target.precisions[0]]
    assert api["recipe"] == via_cli["recipe"] and api["artifacts"] == via_cli["artifacts"]  # byte-identical
    for name, report in (("api", api), ("cli", via_cli)):
        assert report["validation"]["target"] == target.name and report["validation"]["passed"]
        assert [r["artifact"] for r in report["validation"]["reports"]] == [str(tmp_path / name / "model.xml")]
    assert result.budgets_passed and result.validations[0].target == target.name


def test_reports_round_trip_and_match_the_schema(tiny_factory, tiny_calib, tmp_path_factory, tmp_path):
    result = edgeopt.compress(tiny_factory, tiny_calib, out=tmp_path / "out", eval_data=tiny_calib,
                              target=loose_target(tmp_path_factory), step_report=True,
                              measuring=Measuring(runs=20, warmup=2, min_seconds=0))
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["schema_version"].startswith("1.") and data["report"] == "compress"
    assert report_schema_errors(data) == []
    report = CompressReport.from_dict(data)
    assert report.to_dict() == data and CompressReport.from_dict(report.to_dict()) == report
    validation = result.validations[0]
    assert ValidationReport.from_dict(json.loads(json.dumps(validation.to_dict()))) == validation
    assert report_schema_errors(validation.to_dict()) == []


def test_schema_rejects_what_a_reader_could_not_rely_on():
    sample = {"schema_version": "1.0", "report": "optimize"}
    assert report_schema_errors(sample)  # required keys missing
    assert any("report" in e or "oneOf" in e or "valid" in e for e in report_schema_errors({"report": "nope"}))


def test_from_dict_refuses_other_kinds_and_versions():
    import pytest

    from edgeopt.errors import BadInputError

    with pytest.raises(BadInputError, match="not a optimize report"):
        OptimizeReport.from_dict({"schema_version": "1.0", "report": "compress"})
    with pytest.raises(BadInputError, match="schema_version='2.0'"):
        CompressReport.from_dict({"schema_version": "2.0", "report": "compress"})

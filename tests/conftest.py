"""Shared fixtures: small real models (built and trained locally) and a CLI runner."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from edgeopt.offline import decline_telemetry

decline_telemetry()  # tests that call edgeopt's modules directly run offline like the CLI and the API

ROOT = Path(__file__).resolve().parents[1]
DIGITS_MODEL = f"{ROOT / 'samples' / 'digits' / 'model.py'}:build"
DIGITS_CALIB = ROOT / "calibration" / "digits" / "calib.npz"
DIGITS_EVAL = ROOT / "calibration" / "digits" / "eval.npz"


class TinyNet(nn.Module):
    """A 2-conv classifier on 1x8x8 inputs: big enough to quantize, small enough to be instant."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


@pytest.fixture(scope="session")
def tiny_torch() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TinyNet().eval(), torch.zeros(1, 1, 8, 8)


@pytest.fixture(scope="session")
def tiny_factory(tmp_path_factory) -> str:
    """A ``file.py:build`` spec for TinyNet."""
    folder = tmp_path_factory.mktemp("factory")
    (folder / "tiny.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import torch\n"
        "from conftest import TinyNet\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return TinyNet().eval(), torch.zeros(1, 1, 8, 8)\n"
    )
    return f"{folder / 'tiny.py'}:build"


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory, tiny_torch) -> Path:
    module, example = tiny_torch
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    torch.onnx.export(module, (example,), str(path), dynamo=False, input_names=["input"], output_names=["logits"])
    return path


@pytest.fixture(scope="session")
def tiny_ir(tmp_path_factory, tiny_onnx) -> Path:
    import openvino as ov

    path = tmp_path_factory.mktemp("ir") / "tiny.xml"
    ov.save_model(ov.convert_model(str(tiny_onnx)), str(path), compress_to_fp16=False)
    return path


@pytest.fixture(scope="session")
def tiny_calib(tmp_path_factory) -> Path:
    """64 random 1x8x8 samples with labels."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("calib") / "calib.npz"
    np.savez(path, input=rng.random((64, 1, 8, 8), dtype=np.float32), labels=rng.integers(0, 10, 64))
    return path


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    """Write device profiles into a folder on $EDGEOPT_TARGETS; returns ``write(name, text) -> path``."""
    folder = tmp_path / "targets"
    folder.mkdir()
    monkeypatch.setenv("EDGEOPT_TARGETS", str(folder))

    def write(name: str, text: str) -> Path:
        path = folder / f"{name}.toml"
        path.write_text(text)
        return path

    return write


@pytest.fixture
def cli():
    """Invoke the edgeopt CLI in-process; returns click's Result (exit_code, output, stderr)."""
    from edgeopt.cli import main

    def invoke(*args: str):
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)

    return invoke


sys.path.insert(0, str(Path(__file__).parent))


REPORT_SCHEMA = ROOT / "docs" / "report.schema.json"
REPORT_KINDS = {"compress", "validation", "validations", "optimize", "fleet"}


def report_schema_errors(data) -> list[str]:
    """Where ``data`` breaks docs/report.schema.json (empty when it conforms)."""
    import json

    import jsonschema

    validator = jsonschema.Draft202012Validator(json.loads(REPORT_SCHEMA.read_text(encoding="utf-8")))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}" for e in validator.iter_errors(data)]


@pytest.fixture(scope="session", autouse=True)
def every_written_report_matches_the_schema(tmp_path_factory):
    """After the suite: every JSON report any test made edgeopt write validates against the published schema."""
    yield
    import json

    problems = []
    checked = 0
    for path in sorted(tmp_path_factory.getbasetemp().rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        # a report.json edgeopt did not write (a test's planted file) has no report kind: not ours to check
        if isinstance(data, dict) and (data.get("report") in REPORT_KINDS
                                       or (path.name == "report.json" and "schema_version" in data)):
            checked += 1
            problems += [f"{path}: {error}" for error in report_schema_errors(data)[:3]]
    assert not problems, "reports that break docs/report.schema.json:\n" + "\n".join(problems[:20])

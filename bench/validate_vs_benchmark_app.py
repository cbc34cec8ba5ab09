"""Benchmark `edgeopt validate` against OpenVINO's own benchmark_app, and INT8 against FP32, on the digits sample.

Prints, from one run on one host:
  1. p50(edgeopt validate) / p50(benchmark_app) on the same INT8 IR, same settings (latency hint, one stream,
     the same thread count, f32 inference precision pinned), rounds interleaved so drift hits both alike;
     the same ratio on a larger FP32 CNN (3x128x128 input, random weights), where per-call overhead matters less;
  2. p50(INT8) / p50(FP32) with f32 pinned, and the FP32 model also in bf16 (this host's OpenVINO default).

benchmark_app reports the runtime's own per-request time (InferRequest.latency, measured inside OpenVINO);
edgeopt validate times each synchronous inference call from Python on inputs bound once (no per-call input
conversion or output copy), as benchmark_app does.

Usage: .venv/bin/python bench/validate_vs_benchmark_app.py [--threads 2] [--seconds 5] [--rounds 3]
Ratios, not absolute times, are the result: the host is shared, so absolute figures drift between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgeopt.device.budgets import Budgets  # noqa: E402
from edgeopt.device.host import host_info  # noqa: E402
from edgeopt.device.runtime import RuntimeSettings, runtime_version  # noqa: E402
from edgeopt.device.validate import validate_artifact  # noqa: E402

BENCHMARK_APP = Path(sys.executable).with_name("benchmark_app")


def compress_digits(out: Path) -> dict[str, Path]:
    """The digits CNN as FP32 and INT8 OpenVINO IR."""
    from edgeopt.pipeline import compress

    model = f"{ROOT / 'samples/digits/model.py'}:build"
    calib = ROOT / "calibration/digits/calib.npz"
    paths = {}
    for name, recipe in (("fp32", ""), ("int8", "int8")):
        result = compress(model, calib, out=out / name, recipe=recipe, formats=("openvino",))
        paths[name] = result.artifacts[0].path
    return paths


def larger_cnn(out: Path) -> Path:
    """A plain FP32 CNN on 1x3x128x128 (random weights, fixed seed) as OpenVINO IR: milliseconds per inference."""
    import openvino as ov
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers, channels = [], 3
    for width in (32, 64, 64, 128, 128):
        layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        channels = width
    module = nn.Sequential(*layers, nn.Flatten(), nn.Linear(128 * 4 * 4, 10)).eval()
    with torch.no_grad():
        model = ov.convert_model(module, example_input=torch.zeros(1, 3, 128, 128), input=[(1, 3, 128, 128)])
    path = out / "cnn128.xml"
    ov.save_model(model, str(path), compress_to_fp16=False)
    return path


def edgeopt_p50(model: Path, settings: RuntimeSettings, seconds: float) -> tuple[float, float]:
    """p50 of the wall-clock inference call and p50 of OpenVINO's own per-request time, in one measurement."""
    report = validate_artifact(model, settings, Budgets(), runs=300, warmup=50, min_seconds=seconds)
    return report.latency.p50_ms, report.runtime_latency.p50_ms


def benchmark_app_p50(model: Path, threads: int, precision: str, seconds: float, folder: Path) -> float:
    config = folder / f"config-{threads}-{precision}.json"
    config.write_text(json.dumps({"CPU": {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
                                          "INFERENCE_PRECISION_HINT": precision}}))
    proc = subprocess.run([str(BENCHMARK_APP), "-m", str(model), "-d", "CPU", "-hint", "latency", "-api", "sync",
                           "-load_config", str(config), "-t", str(max(1, round(seconds)))], capture_output=True, text=True,
                          check=True)
    for prop, want in (("INFERENCE_NUM_THREADS", str(threads)), ("NUM_STREAMS", "1")):
        if not re.search(rf"{prop}: {want}\b", proc.stdout):
            raise SystemExit(f"benchmark_app did not apply {prop}={want}")
    match = re.search(r"Median:\s+([\d.]+) (ms|us)", proc.stdout)
    if not match:
        raise SystemExit("benchmark_app printed no median latency:\n" + proc.stdout[-2000:])
    return float(match.group(1)) / (1000.0 if match.group(2) == "us" else 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median ratio is reported")
    args = parser.parse_args()
    host = host_info()
    print(f"host: {host.cpu_model}, {host.usable_cpus} CPUs, flags {' '.join(host.cpu_flags)}; "
          f"openvino {runtime_version('openvino')}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"settings: LATENCY hint, 1 stream, {args.threads} threads, batch 1, {args.seconds:g} s per measurement, "
          f"{args.rounds} interleaved rounds; edgeopt = validate_artifact (separate process, synchronous "
          f"inference call from Python, inputs bound once), benchmark_app = -hint latency -api sync with the same threads/precision")
    with tempfile.TemporaryDirectory(prefix="edgeopt-bench-") as tmp:
        models = compress_digits(Path(tmp))
        models["cnn128"] = larger_cnn(Path(tmp))
        f32 = RuntimeSettings(threads=args.threads, inference_precision="f32")
        bf16 = RuntimeSettings(threads=args.threads, inference_precision="bf16")
        rows = []
        for round_ in range(args.rounds):
            ours, ours_rt = edgeopt_p50(models["int8"], f32, args.seconds)
            theirs = benchmark_app_p50(models["int8"], args.threads, "f32", args.seconds, Path(tmp))
            fp32, _ = edgeopt_p50(models["fp32"], f32, args.seconds)
            fp32_bf16, _ = edgeopt_p50(models["fp32"], bf16, args.seconds)
            big_ours, big_rt = edgeopt_p50(models["cnn128"], f32, args.seconds)
            big_theirs = benchmark_app_p50(models["cnn128"], args.threads, "f32", args.seconds, Path(tmp))
            rows.append((ours, theirs, fp32, fp32_bf16, big_ours, big_theirs, ours_rt, big_rt))
            print(f"round {round_ + 1}: p50 ms  digits INT8: edgeopt {ours:.4f} (OpenVINO's own {ours_rt:.4f}), "
                  f"benchmark_app {theirs:.4f} | digits FP32: f32 {fp32:.4f}, bf16 {fp32_bf16:.4f} | "
                  f"CNN-128 FP32: edgeopt {big_ours:.3f} (own {big_rt:.3f}), benchmark_app {big_theirs:.3f}")
    ratio = statistics.median(r[0] / r[1] for r in rows)
    int8_fp32 = statistics.median(r[0] / r[2] for r in rows)
    int8_bf16 = statistics.median(r[0] / r[3] for r in rows)
    big = statistics.median(r[4] / r[5] for r in rows)
    ratio_rt = statistics.median(r[6] / r[1] for r in rows)
    big_rt = statistics.median(r[7] / r[5] for r in rows)
    print(f"p50 edgeopt validate / benchmark_app, digits INT8 (f32, {args.threads} threads): {ratio:.2f} wall-clock, "
          f"{ratio_rt:.2f} with OpenVINO's own per-request time")
    print(f"p50 edgeopt validate / benchmark_app, CNN-128 FP32 (f32, {args.threads} threads): {big:.2f} wall-clock, "
          f"{big_rt:.2f} with OpenVINO's own per-request time")
    print(f"p50 INT8 / FP32 (both f32 pinned): {int8_fp32:.2f}")
    print(f"p50 INT8 / FP32 run in bf16 (host default): {int8_bf16:.2f}")


if __name__ == "__main__":
    main()

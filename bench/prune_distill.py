"""Does 50% channel pruning + distillation + INT8 beat INT8 alone? One run, both samples, ratios printed.

    .venv/bin/python bench/prune_distill.py [--samples digits,resnet_digits] [--rounds 30] [--threads N]

For each sample: compress to FP32 IR, to INT8 (PTQ), and with ``prune,distill,int8`` (training on the
sample's training split); then time the three IRs in OpenVINO with the same pinned settings (f32 inference
precision, fixed threads, batch 1), interleaved round by round so that load from other processes hits all
three alike, and report p50 over all rounds. Goals (issue 4): p50 >= 1.5x lower and artifact >= 2x smaller than
INT8 alone, top-1 drop <= 1.5 pp vs the FP32 original.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgeopt.cli.streams import library_output  # noqa: E402
from edgeopt.device.host import host_info  # noqa: E402
from edgeopt.device.measure import time_inferences  # noqa: E402
from edgeopt.device.runtime import OpenVINOSession, RuntimeSettings, random_feeds, runtime_version  # noqa: E402
from edgeopt.device.stats import latency_stats  # noqa: E402
from edgeopt.pipeline import compress  # noqa: E402

SAMPLES = {
    "digits": dict(model=ROOT / "samples/digits/model.py", calib=ROOT / "calibration/digits/calib.npz",
                   eval=ROOT / "calibration/digits/eval.npz", train=ROOT / "calibration/digits/train.npz"),
    "resnet_digits": dict(model=ROOT / "samples/resnet_digits/model.py",
                          calib=f"{ROOT / 'samples/resnet_digits/datasets.py'}:calib",
                          eval=f"{ROOT / 'samples/resnet_digits/datasets.py'}:eval",
                          train=f"{ROOT / 'samples/resnet_digits/datasets.py'}:train"),
}
VARIANTS = {"FP32": "", "INT8": "int8", "prune50+distill+INT8": "prune,distill,int8"}


def run_sample(name: str, folder: Path, settings: RuntimeSettings, rounds: int, per_round: int) -> None:
    paths = SAMPLES[name]
    results = {}
    for label, recipe in VARIANTS.items():
        with library_output(quiet=False):  # NNCF's progress bars to stderr: stdout carries the table
            results[label] = compress(f"{paths['model']}:build", paths["calib"],
                                      out=folder / name / label.replace("+", "_"), recipe=recipe,
                                      formats=("openvino",), eval_data=paths["eval"], train_data=paths["train"],
                                      quiet=True)
    sessions = {label: OpenVINOSession(r.artifacts[0].path, settings) for label, r in results.items()}
    feeds = random_feeds(next(iter(sessions.values())).inputs)
    timings: dict[str, list[float]] = {label: [] for label in sessions}
    for _ in range(rounds):
        for label, session in sessions.items():
            timings[label] += time_inferences(session, feeds, runs=per_round, warmup=5).wall_ms
    stats = {label: latency_stats(values) for label, values in timings.items()}
    reference = results["FP32"].reference.top1
    print(f"\n== {name}: original (PyTorch FP32) top-1 {reference * 100:.2f}% on {paths['eval']}")
    print(f"{'variant':24} {'IR bytes':>10} {'top-1':>8} {'drop pp':>8} {'p50 ms':>8} {'p95 ms':>8}")
    for label, result in results.items():
        top1 = result.qualities["openvino"].top1
        print(f"{label:24} {result.artifacts[0].bytes:>10,} {top1 * 100:>7.2f}% {(reference - top1) * 100:>8.2f} "
              f"{stats[label].p50_ms:>8.3f} {stats[label].p95_ms:>8.3f}")
    int8, best = "INT8", "prune50+distill+INT8"
    speedup = stats[int8].p50_ms / stats[best].p50_ms
    smaller = results[int8].artifacts[0].bytes / results[best].artifacts[0].bytes
    drop = (reference - results[best].qualities["openvino"].top1) * 100
    print(f"p50 INT8 / pruned: {speedup:.2f}x (goal >= 1.5x: {'met' if speedup >= 1.5 else 'NOT met'}); "
          f"size INT8 / pruned: {smaller:.2f}x (goal >= 2x: {'met' if smaller >= 2 else 'NOT met'}); "
          f"top-1 drop vs FP32 original: {drop:.2f} pp (goal <= 1.5: {'met' if drop <= 1.5 else 'NOT met'})")
    print("steps of prune50+distill+INT8 (each row: p50 over the step report's own 200 runs):")
    for row in results[best].steps.rows:
        print(f"  {row.step:12} params {row.params:>9,}  MACs {row.macs:>11,}  IR {row.ir_bytes:>9,} B  "
              f"top-1 {row.top1 * 100:6.2f}%  cosine {row.cosine:.5f}  p50 {row.p50_ms:.3f} ms")
    for note in results[best].notes:
        print(f"  note: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default=",".join(SAMPLES))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="default: the CPUs this process may use")
    args = parser.parse_args()
    host = host_info()
    settings = RuntimeSettings(inference_precision="f32", threads=args.threads or host.usable_cpus)
    print(f"host: {host.cpu_model}, {host.usable_cpus} usable CPUs; OpenVINO {runtime_version('openvino')}; "
          f"batch 1, threads={settings.threads}, streams=1, INFERENCE_PRECISION_HINT=f32, hint LATENCY; "
          f"{args.rounds} interleaved rounds x {args.per_round} timed runs (5 warm-up per round) per model")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.samples.split(","):
            run_sample(name.strip(), Path(tmp), settings, args.rounds, args.per_round)


if __name__ == "__main__":
    main()

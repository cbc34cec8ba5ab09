"""Does 50% channel pruning + distillation + INT8 beat INT8 alone? One run, both samples, ratios printed.

    .venv/bin/python bench/prune_distill.py [--samples digits,resnet_digits] [--rounds 30] [--threads N]

For each sample: compress to FP32, to INT8 (PTQ), with ``prune,distill,int8`` (training on the sample's
training split), and, as a latency floor, with 90% of the channels pruned and no fine-tuning, each saved as
OpenVINO IR and ONNX; then time the IRs in OpenVINO (f32 inference precision pinned) and the ONNX files in ONNX
Runtime, same threads, batch 1, inputs bound once, interleaved round by round so that load from other processes
hits every model alike, and report p50 over all rounds.
Goals (issue 4), per runtime: p50 >= 1.5x lower and artifact >= 2x smaller than INT8 alone, top-1 drop <= 1.5 pp
vs the FP32 original.
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
from edgeopt.device.measure import time_interleaved  # noqa: E402
from edgeopt.device.runtime import RuntimeSettings, open_session, random_feeds, runtime_version  # noqa: E402
from edgeopt.device.stats import latency_stats  # noqa: E402
from edgeopt.pipeline import compress  # noqa: E402
from edgeopt.recipe import Recipe, Step  # noqa: E402

SAMPLES = {
    "digits": dict(model=ROOT / "samples/digits/model.py", calib=ROOT / "calibration/digits/calib.npz",
                   eval=ROOT / "calibration/digits/eval.npz", train=ROOT / "calibration/digits/train.npz"),
    "resnet_digits": dict(model=ROOT / "samples/resnet_digits/model.py",
                          calib=f"{ROOT / 'samples/resnet_digits/datasets.py'}:calib",
                          eval=f"{ROOT / 'samples/resnet_digits/datasets.py'}:eval",
                          train=f"{ROOT / 'samples/resnet_digits/datasets.py'}:train"),
}
VARIANTS = {"FP32": "", "INT8": "int8", "prune50+distill+INT8": "prune,distill,int8",
            # Same topology with 90% of the channels cut and no fine-tuning: useless for accuracy, it shows the
            # latency floor the runtime's fixed per-call and per-layer costs leave on this host.
            "floor: prune90+INT8": Recipe((Step("prune", {"ratio": 0.9}), Step("int8")))}
FLOOR = "floor: prune90+INT8"


RUNTIMES = {"openvino": "OpenVINO (IR)", "onnx": "ONNX Runtime (ONNX)"}


def run_sample(name: str, folder: Path, threads: int, rounds: int, per_round: int) -> None:
    paths = SAMPLES[name]
    results = {}
    for label, recipe in VARIANTS.items():
        with library_output(quiet=False):  # NNCF's progress bars to stderr: stdout carries the table
            results[label] = compress(f"{paths['model']}:build", paths["calib"],
                                      out=folder / name / label.replace("+", "_"), recipe=recipe,
                                      formats=tuple(RUNTIMES), eval_data=paths["eval"], train_data=paths["train"],
                                      step_report=False if label == FLOOR else None, quiet=True)
    settings = {"openvino": RuntimeSettings(inference_precision="f32", threads=threads),
                "onnx": RuntimeSettings(runtime="onnxruntime", threads=threads)}
    sessions = {(label, artifact.format): open_session(artifact.path, settings[artifact.format])
                for label, result in results.items() for artifact in result.artifacts}
    feeds = random_feeds(next(iter(sessions.values())).inputs)
    timings = time_interleaved(list(sessions.values()), feeds, rounds, per_round, warmup=5)
    p50 = {key: latency_stats(values).p50_ms for key, values in zip(sessions, timings)}
    reference = results["FP32"].reference.top1
    print(f"\n== {name}: original (PyTorch FP32) top-1 {reference * 100:.2f}% on {paths['eval']}")
    for fmt, runtime in RUNTIMES.items():
        print(f"-- {runtime}")
        print(f"{'variant':24} {'bytes':>10} {'top-1':>8} {'drop pp':>8} {'p50 ms':>8}")
        for label, result in results.items():
            artifact = next(a for a in result.artifacts if a.format == fmt)
            top1 = result.qualities[fmt].top1
            print(f"{label:24} {artifact.bytes:>10,} {top1 * 100:>7.2f}% {(reference - top1) * 100:>8.2f} "
                  f"{p50[(label, fmt)]:>8.4f}" + ("  (untrained: latency floor only)" if label == FLOOR else ""))
        int8, best = "INT8", "prune50+distill+INT8"
        speedup = p50[(int8, fmt)] / p50[(best, fmt)]
        smaller = (next(a for a in results[int8].artifacts if a.format == fmt).bytes
                   / next(a for a in results[best].artifacts if a.format == fmt).bytes)
        drop = (reference - results[best].qualities[fmt].top1) * 100
        print(f"p50 INT8 / pruned: {speedup:.2f}x (goal >= 1.5x: {_met(speedup >= 1.5)}); "
              f"size INT8 / pruned: {smaller:.2f}x (goal >= 2x: {_met(smaller >= 2)}); "
              f"top-1 drop vs FP32 original: {drop:.2f} pp (goal <= 1.5: {_met(drop <= 1.5)})")
        print(f"ceiling INT8 / floor: {p50[(int8, fmt)] / p50[(FLOOR, fmt)]:.2f}x (no channel pruning of this "
              f"topology can lower p50 by more in this runtime on this host)")
    print("steps of prune50+distill+INT8 (each row: OpenVINO p50 over the step report's own 200 runs):")
    for row in results["prune50+distill+INT8"].steps.rows:
        print(f"  {row.step:12} params {row.params:>9,}  MACs {row.macs:>11,}  IR {row.ir_bytes:>9,} B  "
              f"top-1 {row.top1 * 100:6.2f}%  cosine {row.cosine:.5f}  p50 {row.p50_ms:.4f} ms")
    for note in results["prune50+distill+INT8"].notes:
        print(f"  note: {note}")


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default=",".join(SAMPLES))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="default: the CPUs this process may use")
    args = parser.parse_args()
    host = host_info()
    threads = args.threads or host.usable_cpus
    print(f"host: {host.cpu_model}, {host.usable_cpus} usable CPUs; OpenVINO {runtime_version('openvino')} "
          f"(INFERENCE_PRECISION_HINT=f32, hint LATENCY, 1 stream), ONNX Runtime {runtime_version('onnxruntime')} "
          f"(CPU provider); batch 1, threads={threads}; inputs bound once; {args.rounds} interleaved rounds x "
          f"{args.per_round} timed runs per model and runtime (5 warm-up, then 2 per round)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.samples.split(","):
            run_sample(name.strip(), Path(tmp), threads, args.rounds, args.per_round)


if __name__ == "__main__":
    main()

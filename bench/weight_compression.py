"""Weight-only compression of the transformer samples: FP32 vs INT8 vs INT4 (group 64/128, ratio 0.8/1.0).

Prints, from one run: weight bytes (weight constants as saved in the IR) and IR file size with their ratios to
FP32, fidelity vs the original PyTorch model on held-out inputs (cosine of embeddings for the text encoder;
top-1 next-token agreement and perplexity for the LM) against fixed thresholds, and p50 latency (OpenVINO,
batch 1, pinned precision and threads) with its ratio to FP32.

    .venv/bin/python bench/weight_compression.py [--runs 200] [--threads 1] [--out /tmp/wc-bench]

The first run trains the samples (about a minute each on 2 cores) and caches their weights.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgeopt.data import load_samples  # noqa: E402
from edgeopt.device.host import host_info  # noqa: E402
from edgeopt.device.measure import measure_latency  # noqa: E402
from edgeopt.device.runtime import RuntimeSettings, open_session, runtime_version  # noqa: E402
from edgeopt.evaluate import compare_outputs, first_outputs, next_token_fidelity, torch_predictor  # noqa: E402
from edgeopt.export import save_artifacts  # noqa: E402
from edgeopt.passes.base import PassContext, WorkingModel  # noqa: E402
from edgeopt.passes.weights import WeightsConfig, weights  # noqa: E402
from edgeopt.source import load_model  # noqa: E402
from edgeopt.formats import artifact_weight_bytes  # noqa: E402

SAMPLES = {"text_encoder": "encoder", "tiny_lm": "lm"}
VARIANTS = {
    "fp32": None,
    "int8_asym": {"mode": "int8_asym"},
    "int8_sym": {"mode": "int8_sym"},
    "int4 g128 r0.8": {"mode": "int4_sym", "group_size": 128, "ratio": 0.8},
    "int4 g128 r1.0": {"mode": "int4_sym", "group_size": 128, "ratio": 1.0},
    "int4 g64 r0.8": {"mode": "int4_sym", "group_size": 64, "ratio": 0.8},
    "int4 g64 r1.0": {"mode": "int4_sym", "group_size": 64, "ratio": 1.0},
    "int4 g128 r0.8 awq+se": {"mode": "int4_sym", "group_size": 128, "ratio": 0.8, "awq": True,
                              "scale_estimation": True, "subset_size": 64},
    "int4 g128 r1.0 gptq": {"mode": "int4_sym", "group_size": 128, "ratio": 1.0, "gptq": True, "subset_size": 32},
}
MIN_COSINE = 0.98  # encoder: mean cosine similarity of embeddings to the original's
MIN_AGREEMENT, MAX_PPL_RATIO = 0.90, 1.10  # LM: top-1 next-token agreement, perplexity vs the original's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/edgeopt-weight-bench"))
    parser.add_argument("--samples", default=",".join(SAMPLES))
    args = parser.parse_args()
    settings = RuntimeSettings(inference_precision="f32", threads=args.threads)
    host = host_info()
    print(f"latency: OpenVINO {runtime_version('openvino')} CPU, batch 1, {args.runs} timed runs after 20 warm-up, "
          f"threads={args.threads}, INFERENCE_PRECISION_HINT=f32, 1 stream, LATENCY hint; host {host.cpu_model}; "
          f"weight bytes: IR weight constants as saved (compressed models: remaining float constants in FP16)")
    for sample in args.samples.split(","):
        bench_sample(sample, args.out / sample, settings, args.runs)


def bench_sample(sample: str, out: Path, settings: RuntimeSettings, runs: int) -> None:
    kind = SAMPLES[sample]
    started = time.perf_counter()
    source = load_model(f"{ROOT / 'samples' / sample / 'model.py'}:build")
    calib = load_samples(ROOT / "calibration" / sample / "calib.npz", source.inputs)
    held_out = load_samples(ROOT / "calibration" / sample / "eval.npz", source.inputs)
    reference = first_outputs(torch_predictor(source.torch_module, source.input_names), held_out)
    ids = np.concatenate([s["input"] for s in held_out.samples])
    print(f"\n== {sample} ({sum(p.numel() for p in source.torch_module.parameters()) / 1e6:.2f} M parameters; "
          f"fidelity on {len(held_out)} held-out inputs; model ready in {time.perf_counter() - started:.0f} s)")
    header = (f"{'variant':24} {'weight bytes':>12} {'ratio':>6} {'IR file':>10} {'ratio':>6} "
              f"{'fidelity':52} {'gate':4} {'p50 ms':>7} {'speed-up':>8} {'compress s':>10}")
    print(header)
    base_weights = base_file = base_p50 = None
    for name, params in VARIANTS.items():
        model = WorkingModel(source, graphs={"openvino": source.openvino_model()})
        started = time.perf_counter()
        if params:
            weights(model, PassContext(calibration=calib), WeightsConfig(**params))
        seconds = time.perf_counter() - started
        folder = out / name.replace(" ", "_").replace("+", "_")
        folder.mkdir(parents=True, exist_ok=True)
        artifact = save_artifacts(model, folder, ("openvino",))[0]
        weight_bytes = artifact_weight_bytes(artifact.path).total
        session = open_session(artifact.path, settings)
        outputs = first_outputs(session.infer, held_out)
        if kind == "encoder":
            cosine = compare_outputs(outputs, reference).cosine
            fidelity, ok = f"cosine {cosine:.5f} (min {MIN_COSINE})", cosine >= MIN_COSINE
        else:
            token = next_token_fidelity(outputs, reference, ids)
            ok = token.check(MIN_AGREEMENT, MAX_PPL_RATIO)[0]
            fidelity = (f"top-1 agree {token.top1_agreement:.4f}, ppl {token.perplexity:.3f} "
                        f"(orig {token.reference_perplexity:.3f})")
        p50 = measure_latency(session, held_out.samples[0], runs=runs, warmup=20).p50_ms
        base_weights, base_file, base_p50 = base_weights or weight_bytes, base_file or artifact.bytes, base_p50 or p50
        print(f"{name:24} {weight_bytes:>12,} {base_weights / weight_bytes:>5.2f}x {artifact.bytes / 1e6:>8.3f}MB "
              f"{base_file / artifact.bytes:>5.2f}x {fidelity:52} {'PASS' if ok else 'FAIL'} {p50:>7.3f} "
              f"{base_p50 / p50:>7.2f}x {seconds:>10.1f}")
        for note in (n for n in model.notes if "NNCF:" in n):
            print(f"{'':24} ^ {note}")
    if kind == "lm":
        print(f"LM gate: top-1 next-token agreement ≥ {MIN_AGREEMENT}, perplexity ≤ {MAX_PPL_RATIO}x the original's")


if __name__ == "__main__":
    main()

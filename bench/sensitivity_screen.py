"""How well the screen of edgeopt.sensitivity orders quantized operations, against the exact probe of every one
(each kept alone in float and judged), on trained models — and what each costs, in one run.

    .venv/bin/python bench/sensitivity_screen.py [--only minilm-l6,ppocr-det] [--calib 64] [--eval 32]
                                                 [--min-cosine 0.997] [--json out.json]

Per model (data and loading as bench/repair.py): plain INT8 (the int8 step, weights under FakeQuantize), the
ranking samples the repair uses (the evaluation samples INT8 gets most wrong), then ``analyse`` with every group
probed (``probe_share=1``: the full ranking, the anchor). From the same run: the screen's orders (the gain in the
switched model, on the worst ``SCREEN_SAMPLES`` of them; the noise added; the output SQNR) against the probe's; the overlap of the probe's top k with the screen's top ``n`` (the groups the
repair's default ``probe_share`` would probe) and the rank correlation; the screen's time and the probes'.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import conformance  # noqa: E402  (the corpus, its wheels and data)
import repair  # noqa: E402  (the same models and data as the repair bench)


def run_model(entry, work: Path, calib_count: int, eval_count: int, min_cosine: float) -> dict:
    from edgeopt.data import load_samples
    from edgeopt.evaluate import QualityGate
    from edgeopt.judge import Judge
    from edgeopt.passes.quantize import Int8Config, quantize_openvino
    from edgeopt.passes.repair import Int8RepairConfig
    from edgeopt.sensitivity import analyse, probe_count

    spec, _, source, calib, held = repair.prepare(entry, work, calib_count, eval_count)
    fp32 = repair.fp32_model(spec, source)
    config = Int8RepairConfig()
    int8 = quantize_openvino(fp32, source.model_type, load_samples(calib, source.inputs),
                             Int8Config(subset_size=config.subset_size), compress_weights=False).model
    gate = QualityGate(min_cosine=min_cosine)
    judge = Judge(fp32, load_samples(held, source.inputs), gate, source.output_names)
    samples = judge.worst_samples(judge(int8), config.ranking_samples)
    full = analyse(fp32, int8, samples, gate, source.output_names)
    probe = [op.name for op in full.ranked]  # by gain: the anchor order
    by_gain = sorted(full.ranked, key=lambda op: -op.screen_gain)
    by_noise = sorted(full.ranked, key=lambda op: (op.screen_noise_db is not None, op.screen_noise_db or 0))
    by_sqnr = sorted(full.ranked, key=lambda op: (op.screen_sqnr_db is not None, op.screen_sqnr_db or 0))
    # how many groups the repair's default probe_share probes, in the screen's order
    probed = probe_count([len(op.operations) for op in by_gain],
                         max(config.probe_share, config.max_float_share) * full.quantized_ops)
    agreement = {}
    for name, order in (("switched gain", by_gain), ("added noise", by_noise), ("output sqnr", by_sqnr)):
        names = [op.name for op in order]
        agreement[name] = {
            f"top{k}_in_screen_top{probed}": len(set(probe[:k]) & set(names[:probed])) for k in (1, 3, 5, 10)
            if k <= len(probe)} | {"spearman": round(_spearman(probe, names), 3),
                                   "probe_rank_of_screen_worst": probe.index(names[0]) + 1}
    return {"model": entry.name, "groups": len(full.ranked), "quantized_ops": full.quantized_ops,
            "samples": full.samples, "screen_s": full.screen_seconds, "full_s": full.seconds,
            "repair_would_probe": probed, "agreement": agreement,
            "ranked": [{"name": op.name, "label": op.label, "gain": op.gain, "screen_gain": op.screen_gain, "screen_noise_db": op.screen_noise_db,
                        "screen_sqnr_db": op.screen_sqnr_db} for op in full.ranked]}


def _spearman(first: list[str], second: list[str]) -> float:
    position = {name: i for i, name in enumerate(second)}
    a = np.arange(len(first), dtype=float)
    b = np.array([position[name] for name in first], dtype=float)
    return float(np.corrcoef(a, b)[0, 1]) if len(first) > 1 else 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="minilm-l6,ppocr-det")
    parser.add_argument("--calib", type=int, default=64)
    parser.add_argument("--eval", type=int, default=32)
    parser.add_argument("--min-cosine", type=float, default=0.997)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    conformance.fetch_wheels()
    entries = {e.name: e for e in conformance.CORPUS}
    results = []
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory(prefix=f"screen-{name}-") as tmp:
            result = run_model(entries[name], Path(tmp), args.calib, args.eval, args.min_cosine)
        results.append(result)
        print(f"{name}: {result['groups']} groups of {result['quantized_ops']} quantized operations on "
              f"{result['samples']} samples; screen {result['screen_s']:.1f} s, screen + every probe "
              f"{result['full_s']:.1f} s; the repair would probe {result['repair_would_probe']}", flush=True)
        for order, figures in result["agreement"].items():
            print(f"  screen by {order}: " + ", ".join(f"{k} {v}" for k, v in figures.items()), flush=True)
        for i, op in enumerate(result["ranked"][:10], 1):
            print(f"    {i:>2} {op['label'][:70]:<70} gain {op['gain']:+.5f} screened {op['screen_gain']:+.5f} noise {op['screen_noise_db']} dB "
                  f"sqnr {op['screen_sqnr_db']} dB", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

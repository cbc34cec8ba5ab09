"""The staged plan vs the Pareto search (`edgeopt optimize --search pareto`) on the same model and target, one run.

    .venv/bin/python bench/pareto.py [--sample resnet_digits] [--target generic-x86-avx2-2core] [--trials 16]
                                     [--sampler nsga2] [--runs 100] [--rounds 30]

Each search runs from an empty cache of its own (so its wall time includes every build), with the same
measurement settings (the profile's: emulated here, threads pinned, f32 inference precision pinned). The table
gives, per search, the chosen artifact's recipe, its objective figure as the search measured it, its size and
quality, the candidates built and the wall time. Figures measured in two searches at different moments on a shared
host are not comparable to a few percent, so both chosen artifacts are then timed again side by side in OpenVINO
(the profile's threads, f32 pinned, batch 1, inputs bound once), interleaved round by round so that load from
other processes hits both alike; the p50 ratio printed is that head-to-head one. The anchor is the staged plan,
edgeopt's default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgeopt.api import optimize  # noqa: E402
from edgeopt.cli.streams import library_output  # noqa: E402
from edgeopt.device.host import host_info  # noqa: E402
from edgeopt.device.measure import time_interleaved  # noqa: E402
from edgeopt.device.runtime import RuntimeSettings, open_session, random_feeds, runtime_version  # noqa: E402
from edgeopt.device.stats import latency_stats  # noqa: E402
from edgeopt.optimization.pareto import ParetoSearch  # noqa: E402
from edgeopt.targets import Measuring, load_target  # noqa: E402

SAMPLES = {
    "digits": (f"{ROOT / 'samples/digits/model.py'}:build", ROOT / "calibration/digits/calib.npz",
               ROOT / "calibration/digits/eval.npz"),
    "resnet_digits": (f"{ROOT / 'samples/resnet_digits/model.py'}:build",
                      f"{ROOT / 'samples/resnet_digits/datasets.py'}:calib",
                      f"{ROOT / 'samples/resnet_digits/datasets.py'}:eval"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", choices=SAMPLES, default="resnet_digits")
    parser.add_argument("--target", default="generic-x86-avx2-2core")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--sampler", choices=("nsga2", "tpe"), default="nsga2")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per candidate inside the searches")
    parser.add_argument("--rounds", type=int, default=30, help="head-to-head rounds (x 20 runs per artifact)")
    args = parser.parse_args()
    model, calib, evaluation = SAMPLES[args.sample]
    target = load_target(args.target)
    measuring = Measuring(runs=args.runs, warmup=10, min_seconds=0.5)
    results, seconds = {}, {}
    with tempfile.TemporaryDirectory(prefix="edgeopt-bench-pareto-") as tmp:
        for name, pareto in (("staged plan", None), (f"pareto ({args.sampler}, {args.trials} trials)",
                                                     ParetoSearch(args.trials, args.sampler))):
            started = time.perf_counter()
            with library_output(quiet=True):
                results[name] = optimize(model, calib, evaluation, target=target, out=Path(tmp) / name,
                                         cache_dir=Path(tmp) / f"cache-{len(results)}", measuring=measuring,
                                         pareto=pareto)
            seconds[name] = time.perf_counter() - started
        objective = next(iter(results.values())).objective
        print(f"\n== {args.sample} for {target.name}: objective {objective}; "
              f"{next(iter(results.values())).emulation_note or 'on the device'}")
        print(f"{'search':28} {'chosen recipe':44} {objective:>9} {'size KB':>9} {'top-1 drop':>10} "
              f"{'built':>6} {'candidates':>10} {'wall s':>8}")
        for name, result in results.items():
            chosen = result.chosen
            built = sum(1 for c in result.candidates if not c.skipped and not c.reused["artifact"])
            tried = sum(1 for c in result.candidates if not c.skipped)
            if chosen is None:
                print(f"{name:28} {'(none passed: ' + result.verdict + ')':44} {'-':>9} {'-':>9} {'-':>10} "
                      f"{built:>6} {tried:>10} {seconds[name]:>8.1f}")
                continue
            drop = f"{chosen.top1_drop * 100:+.2f} pp" if chosen.top1_drop is not None else f"cos {chosen.cosine:.4f}"
            print(f"{name:28} {chosen.recipe[:44]:44} {chosen.figures[objective]:>9.4g} "
                  f"{chosen.file_bytes / 1e3:>9.1f} {drop:>10} {built:>6} {tried:>10} {seconds[name]:>8.1f}")
        chosen = {name: r.chosen for name, r in results.items() if r.chosen}
        if len(chosen) == 2:
            head_to_head(chosen, target, args.rounds, objective)
    host = host_info()
    print(f"host: {host.cpu_model}, {host.usable_cpus} usable CPUs, load average (1 min) at the end "
          f"{os.getloadavg()[0]:.1f}")


def head_to_head(chosen: dict, target, rounds: int, objective: str) -> None:
    """Both chosen artifacts timed in one process, interleaved: the fair latency ratio."""
    settings = RuntimeSettings(threads=target.settings.threads, inference_precision="f32")
    sessions = [open_session(c.artifact, settings) for c in chosen.values()]
    timings = time_interleaved(sessions, random_feeds(sessions[0].inputs), rounds, 20, warmup=20)
    p50 = [latency_stats(t).p50_ms for t in timings]
    (staged, pareto), (staged_c, pareto_c) = p50, chosen.values()
    print(f"head to head (OpenVINO {runtime_version('openvino')}, {settings.threads} threads, f32 pinned, batch 1, "
          f"{rounds} interleaved rounds x 20 runs, not ISA-capped): p50 staged {staged:.4f} ms, pareto "
          f"{pareto:.4f} ms -> pareto {staged / pareto:.2f}x faster, {staged_c.file_bytes / pareto_c.file_bytes:.2f}x "
          f"smaller (median of per-round ratios "
          f"{statistics.median(a / b for a, b in zip(_rounds(timings[0], rounds), _rounds(timings[1], rounds))):.2f}x)")
    if objective not in ("p50_ms", "p95_ms", "p99_ms"):
        print(f"(the searches minimised {objective}; the head-to-head compares p50 only)")


def _rounds(values: list[float], rounds: int) -> list[float]:
    size = len(values) // rounds
    return [statistics.median(values[i * size:(i + 1) * size]) for i in range(rounds)]


if __name__ == "__main__":
    main()

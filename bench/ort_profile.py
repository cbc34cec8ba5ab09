"""Where ONNX Runtime spends its time: FP32 and edgeopt's INT8 candidates of one conformance entry, per op kind.

    nice -n 10 .venv/bin/python bench/ort_profile.py ENTRY [--backends ort,ort-conv,...] [--plain]
                        [--threads 2] [--no-spin] [--no-profile] [--rounds 12] [--json FILE]

The entry's FP32 ONNX file and calibration data are the conformance bench's (bench/conformance.py); each backend
is built by edgeopt's own ONNX INT8 machinery (``edgeopt.passes.onnx_int8.quantize_onnx`` with that backend
alone); ``--plain`` adds ``fp32-simplified`` (the FP32 graph as edgeopt normalises it) and each backend built on
the graph normalised without the element-wise simplification (``BACKEND-plain``: quantize_static's recipe on
the graph as ``quantize_static`` sees it). Every model runs in ONNX Runtime's CPU provider, ``--threads`` intra-op
threads (default 2, as edgeopt measures), ``ORT_ENABLE_ALL``, thread-pool spinning on unless ``--no-spin``
(``session.intra_op.allow_spinning``), profiling on (``SessionOptions.enable_profiling``) unless
``--no-profile``, in interleaved rounds (each model in turn, order alternating) so that the host's load hits all
alike. Printed per model: the median of per-round block medians of wall time, the median of per-round ratios
to FP32's, and (profiling) kernel time per run summed by op kind (Conv kernels split into depthwise and dense by
the optimised graph's ``group``). Kernel times are the profiler's per-node ``dur`` (wall time of a node, thread
pool included): use their ratios, not their absolute values, on a shared host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conformance  # noqa: E402  (the bench's entries, model files and data)

CONVS = ("Conv", "FusedConv", "QLinearConv", "NhwcFusedConv", "ConvInteger")


def prepare(name: str, work: Path):
    """The entry's FP32 ONNX path (a PyTorch factory's exported as edgeopt exports it), calibration and held-out
    samples (as the conformance bench makes them)."""
    from edgeopt.source import load_model

    entry = next(e for e in conformance.CORPUS if e.name == name)
    spec = conformance.model_spec(entry, work)
    source = load_model(spec, {k: tuple(v) for k, v in entry.shapes.items()})
    calib = conformance.make_data(source.inputs, conformance.CALIB, 0, entry)
    held = conformance.make_data(source.inputs, conformance.EVAL, 1, entry)
    path = Path(spec) if spec.endswith(".onnx") else conformance.save_fp32(source, work / "fp32")[1]  # a factory
    return path, conformance.split(calib, conformance.CALIB), conformance.split(held, conformance.EVAL)


def build(fp32: Path, calib: list[dict], backend: str, simplify: bool = True):
    """edgeopt's ``backend`` candidate of the model (its normalisation included; ``simplify``: with the
    element-wise simplification)."""
    import onnx

    from edgeopt import onnx_prep
    from edgeopt.data import SampleSet
    from edgeopt.passes.onnx_int8 import quantize_onnx

    samples = SampleSet(calib, None, "conformance bench")
    kept = onnx_prep.simplify_element_wise
    if not simplify:  # quantize_onnx normalises itself: this bench's comparison switches that one step off
        onnx_prep.simplify_element_wise = lambda model: []
    try:
        return quantize_onnx(onnx.load(str(fp32)), samples, subset_size=len(calib), nncf_options={},
                             backends=(backend,)).model
    finally:
        onnx_prep.simplify_element_wise = kept


def session(path: Path, profile: bool, optimised: Path | None = None, threads: int = conformance.THREADS,
            spin: bool = True):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(path.with_suffix(""))
    if optimised is not None:
        options.optimized_model_filepath = str(optimised)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def depthwise_nodes(optimised: Path) -> set[str]:
    """Names of the Conv-like nodes of ONNX Runtime's optimised graph with a group above 1 (depthwise, in these
    nets)."""
    import onnx

    names = set()
    for node in onnx.load(str(optimised)).graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type in CONVS and group > 1:
            names.add(node.name)
    return names


def kernel_times(trace: Path, depthwise: set[str], runs: int) -> dict[str, float]:
    """Per op kind, ms of kernel time per run (the profiler's node events)."""
    totals: dict[str, float] = defaultdict(float)
    for event in json.loads(trace.read_text()):
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        op = event["args"].get("op_name", "?")
        node = event["name"][: -len("_kernel_time")]
        if op in CONVS:
            op = f"{op} ({'depthwise' if node in depthwise else 'dense'})"
        totals[op] += event["dur"] / 1000.0
    return {op: ms / runs for op, ms in totals.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entry")
    parser.add_argument("--backends", default="ort")
    parser.add_argument("--plain", action="store_true", help="also each backend without the simplification")
    parser.add_argument("--threads", type=int, default=conformance.THREADS)
    parser.add_argument("--no-spin", action="store_true", help="session.intra_op.allow_spinning = 0")
    parser.add_argument("--no-profile", action="store_true", help="timing only")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    import onnx

    from edgeopt.onnx_prep import normalise
    from edgeopt.passes.onnx_int8 import worst_output_cosine

    profile, spin = not args.no_profile, not args.no_spin
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fp32_path, calib, held = prepare(args.entry, work)
        models = {"fp32": fp32_path}
        if args.plain:
            models["fp32-simplified"] = work / "fp32-simplified.onnx"
            onnx.save(normalise(onnx.load(str(fp32_path)), feeds=calib[0]).model, str(models["fp32-simplified"]))
        for backend in args.backends.split(","):
            for simplify in (True, False) if args.plain else (True,):
                name = backend if simplify else f"{backend}-plain"
                models[name] = work / f"{name}.onnx"
                onnx.save(build(fp32_path, calib, backend, simplify), str(models[name]))
        feeds = held[0]
        sessions, depthwise = {}, {}
        reference = [session(fp32_path, False).run(None, s) for s in held]
        figures = {}
        for name, path in models.items():
            optimised = work / f"{name}.opt.onnx"
            plain = session(path, False, optimised)  # the optimised graph, to tell depthwise Convs by name
            figures[name] = {"bytes": path.stat().st_size, "size_ratio": round(path.stat().st_size / fp32_path.stat().st_size, 3),
                             "cosine": round(worst_output_cosine([plain.run(None, s) for s in held], reference), 4)}
            depthwise[name] = depthwise_nodes(optimised)
            sessions[name] = session(path, profile, threads=args.threads, spin=spin)
            for _ in range(3):
                sessions[name].run(None, feeds)
        start = time.perf_counter()
        sessions["fp32"].run(None, feeds)
        per_round = int(min(max(0.1 / (time.perf_counter() - start), 3), 50))
        load = [round(v, 1) for v in os.getloadavg()]
        names, blocks, runs = list(models), defaultdict(list), defaultdict(int)
        for round_index in range(args.rounds):
            for name in names if round_index % 2 == 0 else names[::-1]:
                walls = []
                for _ in range(per_round):
                    start = time.perf_counter()
                    sessions[name].run(None, feeds)
                    walls.append((time.perf_counter() - start) * 1000.0)
                blocks[name].append(float(np.median(walls)))
        for name in names:
            ratios = [a / b for a, b in zip(blocks[name], blocks["fp32"])]
            figures[name].update(p50_ms=round(float(np.median(blocks[name])), 3),
                                 p50_ratio=round(float(np.median(ratios)), 3))
            if profile:
                trace = Path(sessions[name].end_profiling())
                kinds = kernel_times(trace, depthwise[name], args.rounds * per_round + 3)
                figures[name]["kernels_ms"] = {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}
                figures[name]["kernel_sum_ms"] = round(sum(kinds.values()), 3)
                trace.unlink()
        setting = (f"onnxruntime {__import__('onnxruntime').__version__} CPU, {args.threads} thread(s), spinning "
                   f"{'on' if spin else 'off'}, ORT_ENABLE_ALL, {'profiling on, ' if profile else ''}{args.rounds} "
                   f"interleaved rounds x {per_round} runs, load {load} -> {[round(v, 1) for v in os.getloadavg()]}")
        print(f"# {args.entry}: {setting}")
        for name, fig in figures.items():
            print(f"\n## {name}: p50 {fig['p50_ms']} ms ({fig['p50_ratio']:.2f}x fp32), size {fig['size_ratio']}x, "
                  f"cosine {fig['cosine']}" + (f", kernel sum {fig['kernel_sum_ms']} ms" if profile else ""))
            for op, ms in fig.get("kernels_ms", {}).items():
                if ms >= 0.05:
                    print(f"  {op:40s} {ms:8.3f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"entry": args.entry, "setting": setting, "figures": figures},
                                                  indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

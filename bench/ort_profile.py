"""Where ONNX Runtime spends its time: FP32 and edgeopt's INT8 candidates of one conformance entry, per op kind.

    nice -n 10 .venv/bin/python bench/ort_profile.py ENTRY [--backends ort,ort-conv,...] [--rounds 10]

The entry's FP32 ONNX file and calibration data are the conformance bench's (bench/conformance.py); each backend
is built by edgeopt's own ONNX INT8 machinery (``edgeopt.passes.onnx_int8.quantize_onnx`` with that backend
alone). Every model runs in ONNX Runtime's CPU provider, 2 threads, ``ORT_ENABLE_ALL``, profiling on
(``SessionOptions.enable_profiling``), in interleaved rounds (each model in turn, inputs bound once) so that
the host's load hits all alike. Printed per model: kernel time per run summed by op kind (Conv kernels split
into depthwise and dense by the optimised graph's ``group``), the sum, the mean wall time per run, and its
ratio to FP32's from the same rounds. Kernel times are the profiler's per-node ``dur`` (thread-pool time of a
node, not CPU time): use their ratios, not their absolute values, on a shared host.
"""

from __future__ import annotations

import argparse
import json
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
    """The entry's FP32 ONNX path, calibration and held-out samples (as the conformance bench makes them)."""
    from edgeopt.source import load_model

    entry = next(e for e in conformance.CORPUS if e.name == name)
    spec = conformance.model_spec(entry, work)
    source = load_model(spec, {k: tuple(v) for k, v in entry.shapes.items()})
    calib = conformance.make_data(source.inputs, conformance.CALIB, 0, entry.text)
    held = conformance.make_data(source.inputs, conformance.EVAL, 1, entry.text)
    return Path(spec), conformance.split(calib, conformance.CALIB), conformance.split(held, conformance.EVAL)


def build(fp32: Path, calib: list[dict], backend: str):
    """edgeopt's ``backend`` candidate of the model (its normalisation included)."""
    import onnx

    from edgeopt.data import SampleSet
    from edgeopt.passes.onnx_int8 import quantize_onnx

    samples = SampleSet(calib, None, "conformance bench")
    result = quantize_onnx(onnx.load(str(fp32)), samples, subset_size=len(calib), nncf_options={},
                           backends=(backend,))
    return result.model


def session(path: Path, profile: bool, optimised: Path | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = conformance.THREADS
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
    """Names of the Conv-like nodes of ONNX Runtime's optimised graph whose group equals their channel count > 1."""
    import onnx

    names = set()
    for node in onnx.load(str(optimised)).graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type in CONVS + ("Conv",) and group > 1:
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
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fp32_path, calib, held = prepare(args.entry, work)
        models = {"fp32": fp32_path}
        for backend in args.backends.split(","):
            path = work / f"{backend}.onnx"
            onnx.save(build(fp32_path, calib, backend), str(path))
            models[backend] = path
        feeds = held[0]
        sessions, depthwise, walls = {}, {}, defaultdict(list)
        for name, path in models.items():
            optimised = work / f"{name}.opt.onnx"
            session(path, False, optimised)  # the optimised graph, to tell depthwise Convs by name
            depthwise[name] = depthwise_nodes(optimised)
            sessions[name] = session(path, True)
            for _ in range(3):
                sessions[name].run(None, feeds)
        load = [round(v, 1) for v in __import__("os").getloadavg()]
        names = list(models)
        for round_index in range(args.rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                for _ in range(args.per_round):
                    start = time.perf_counter()
                    sessions[name].run(None, feeds)
                    walls[name].append((time.perf_counter() - start) * 1000.0)
        figures = {}
        runs = args.rounds * args.per_round + 3
        for name in names:
            trace = Path(sessions[name].end_profiling())
            kinds = kernel_times(trace, depthwise[name], runs)
            wall = walls[name]
            figures[name] = {"kernels_ms": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
                             "kernel_sum_ms": round(sum(kinds.values()), 3), "wall_median_ms": round(float(np.median(wall)), 3)}
            trace.unlink()
        base = figures["fp32"]["wall_median_ms"]
        print(f"# {args.entry}: onnxruntime CPU, {conformance.THREADS} threads, ORT_ENABLE_ALL, {args.rounds} interleaved "
              f"rounds x {args.per_round} runs, load {load} -> {[round(v, 1) for v in __import__('os').getloadavg()]}")
        for name, fig in figures.items():
            print(f"\n## {name}: wall p50 {fig['wall_median_ms']} ms ({fig['wall_median_ms'] / base:.2f}x fp32), "
                  f"kernel sum {fig['kernel_sum_ms']} ms")
            for op, ms in fig["kernels_ms"].items():
                if ms >= 0.05:
                    print(f"  {op:40s} {ms:8.3f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"entry": args.entry, "load": load, "figures": figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

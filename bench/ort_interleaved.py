"""Time ONNX files against a reference in ONNX Runtime, interleaved, with nothing but numpy and onnxruntime.

For a second host (a quiet machine, a device) that has no edgeopt: copy the files there and run
``python ort_interleaved.py --json out.json NAME=FP32.onnx,INT8.onnx[,ANCHOR.onnx] ...``. Each round runs every
file of a group for ``--runs`` calls (after warm-up) in turn, in a rotating order, and takes each file's median;
the figure per file is the median over rounds of its p50 over the first file's (the FP32 reference), with the
range of the middle 90% of rounds. Inputs: random, at the model's declared sizes (a dynamic dimension at 1),
float inputs standard normal, integer inputs 0..9 — the same for every file of a group.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import onnxruntime as ort

_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
          "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
          "tensor(bool)": np.bool_}


def session(path: str, threads: int, spin: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def feeds(sess: ort.InferenceSession, rng: np.random.Generator, shapes: dict[str, list[int]]) -> dict[str, np.ndarray]:
    made = {}
    for spec in sess.get_inputs():
        shape = shapes.get(spec.name) or [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
        dtype = _NUMPY[spec.type]
        made[spec.name] = (rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                           else rng.integers(0, 10, shape).astype(dtype))
    return made


def p50_ms(sess: ort.InferenceSession, feed: dict, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def group(paths: list[str], threads: int, spin: bool, rounds: int, runs: int, shapes: dict) -> dict:
    sessions = [session(p, threads, spin) for p in paths]
    feed = feeds(sessions[0], np.random.default_rng(0), shapes)
    for sess in sessions:
        p50_ms(sess, feed, max(10, runs // 5))  # warm-up
    p50s = [[] for _ in paths]
    for r in range(rounds):
        order = list(range(len(paths)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            p50s[i].append(p50_ms(sessions[i], feed, runs))
    files = []
    for path, measured in zip(paths, p50s):
        ratios = sorted(m / ref for m, ref in zip(measured, p50s[0]))
        low, high = ratios[int(0.05 * (len(ratios) - 1))], ratios[int(round(0.95 * (len(ratios) - 1)))]
        files.append({"file": os.path.basename(path), "bytes": os.path.getsize(path),
                      "p50_ms": round(statistics.median(measured), 4),
                      "p50_ratio": round(statistics.median(ratios), 4), "p50_ratio_90": [round(low, 4), round(high, 4)],
                      "size_ratio": round(os.path.getsize(path) / os.path.getsize(paths[0]), 4)})
    return {"files": files, "inputs": {name: list(value.shape) for name, value in feed.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="+", help="NAME=REFERENCE.onnx,OTHER.onnx[,...]")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-spin", action="store_true", help="session.intra_op.allow_spinning = 0")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=50, help="calls per file per round")
    parser.add_argument("--shape", action="append", default=[], help="NAME=D1,D2,... for a dynamic input")
    parser.add_argument("--json")
    args = parser.parse_args()
    shapes = {name: [int(d) for d in dims.split(",")] for name, _, dims in (s.partition("=") for s in args.shape)}
    result = {"host": {"machine": platform.machine(), "processor": _cpu_model(), "cpus": os.cpu_count(),
                       "isa": _isa(), "load_1min_start": os.getloadavg()[0], "onnxruntime": ort.__version__},
              "settings": {"threads": args.threads, "spinning": not args.no_spin, "rounds": args.rounds,
                           "runs": args.runs, "graph_optimization": "ORT_ENABLE_ALL"}, "groups": {}}
    for text in args.groups:
        name, _, files = text.partition("=")
        result["groups"][name] = measured = group(files.split(","), args.threads, not args.no_spin, args.rounds,
                                                  args.runs, shapes)
        print(name, " ".join(f"{f['file']} {f['p50_ms']} ms {f['p50_ratio']}x ({f['p50_ratio_90'][0]}-"
                             f"{f['p50_ratio_90'][1]}) size {f['size_ratio']}x" for f in measured["files"]), flush=True)
    result["host"]["load_1min_end"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


def _isa() -> list[str]:
    """The int8-relevant instruction sets the CPU reports (Linux)."""
    try:
        with open("/proc/cpuinfo") as handle:
            flags = next(line.split(":", 1)[1].split() for line in handle if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8") if f in flags]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


if __name__ == "__main__":
    main()

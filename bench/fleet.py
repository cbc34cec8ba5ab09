"""A 2-model × 3-target fleet on 2 Ray workers vs the local executor: wall clock, identical artifacts,
measurement slots, each task's time, and the Amdahl projection for more workers. One run, one host.

    .venv/bin/python bench/fleet.py [--runs 300] [--min-seconds 1]

Models: the digits CNN and the ResNet-style digits CNN (INT8, 64 calibration and 200 evaluation samples).
Targets: digits-tight (350 KB; the ResNet sample misses it), a roomy generic 2-thread box, and the same box
with one inference thread. Both executors start from an empty cache and run as fresh `edgeopt fleet`
processes; the Ray cluster (a head and a worker node on 127.0.0.1, one CPU and one measurement slot each, as
`ray start` would give a team) is started before the clock and stopped after. Goal (issue 16): Ray ≥ 1.3x
faster than local, with the same chosen artifacts and no measurement beside a build.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fleet_support import RayCluster, chosen_files, write_fleet  # noqa: E402

EDGEOPT = Path(sys.executable).with_name("edgeopt")


def run(fleet: Path, out: Path, cache: Path, executor: str, env: dict | None = None) -> tuple[float, dict]:
    started = time.monotonic()
    done = subprocess.run([str(EDGEOPT), "fleet", str(fleet), "--out", str(out), "--cache", str(cache),
                           "--executor", executor, "--quiet"], env={**os.environ, **(env or {})},
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode not in (0, 4):
        raise SystemExit(f"{executor}: exit {done.returncode}: {done.stderr.strip()[-800:]}")
    return seconds, json.loads((out / "report.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="timed inferences per measurement")
    parser.add_argument("--min-seconds", type=float, default=1.0, help="time each measurement at least this long")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        root = Path(tmp)
        fleet = write_fleet(root / "fleet", targets=("tight", "roomy", "single"), runs=args.runs, warmup=20,
                            min_seconds=args.min_seconds)
        load_before = os.getloadavg()
        local_s, local = run(fleet, root / "local", root / "cache-local", "local")
        cluster = RayCluster(cpus_per_node=1)
        try:
            ray_s, ray = run(fleet, root / "ray", root / "cache-ray", f"ray={cluster.address}", cluster.env)
        finally:
            cluster.stop()
        load_after = os.getloadavg()
        same = chosen_files(root / "local") == chosen_files(root / "ray")
        report(local_s, local, ray_s, ray, same, load_before, load_after)


def report(local_s: float, local: dict, ray_s: float, ray: dict, same: bool, load_before, load_after) -> None:
    host = local["host"]
    print(f"host: {host.get('cpu_model')}, {host.get('usable_cpus')} CPUs; 1-min load {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after (other processes share this host)")
    print(f"fleet: {len(local['models'])} models × {len(local['targets'])} targets = {len(local['pairs'])} pairs; "
          f"measuring {local['measuring']}")
    print("\neach task (local executor, then Ray), seconds holding its slot:")
    for name, data in (("local", local), ("ray", ray)):
        for e in data["events"]:
            print(f"  {name:5} {e['kind']:7} {e['pair']:28} {e['end'] - e['start']:7.2f} s  on {e['host']}/{e['node']}"
                  f"  load {e['load_1min']:.1f}")
    builds = sum(e["end"] - e["start"] for e in local["events"] if e["kind"] == "build")
    serial = local_s - builds  # measurements (exclusive by design), loading, reports, bundles, start-up
    share = serial / local_s
    print(f"\nlocal executor: {local_s:.1f} s wall clock; builds {builds:.1f} s (parallelisable), the rest "
          f"{serial:.1f} s serial (measurements hold the machine alone; loading, reports, bundles, start-up)")
    print(f"ray, 2 workers: {ray_s:.1f} s wall clock (cluster started beforehand); "
          f"measurement slots {'held' if ray['slot_overlaps'] == 0 else 'VIOLATED'} "
          f"({ray['slot_overlaps']} overlaps); chosen artifacts {'identical' if same else 'DIFFERENT'}")
    ratio = local_s / ray_s
    print(f"speed-up local / ray: {ratio:.2f}x (goal >= 1.3x: {'met' if ratio >= 1.3 else 'NOT met'})")
    print(f"Amdahl with a serial share of {share:.1%} (from the local run): "
          + ", ".join(f"{n} workers {1 / (share + (1 - share) / n):.2f}x" for n in (2, 4, 16, 64)))


if __name__ == "__main__":
    main()

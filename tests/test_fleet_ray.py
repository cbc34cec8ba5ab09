"""`edgeopt fleet --executor ray=ADDRESS` on a real local Ray cluster (a head and a second worker node on
127.0.0.1, started and stopped here): the same chosen artifacts, byte for byte, as the local executor; a
worker killed mid-build is retried; no measurement overlaps a build on the same machine."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from click.testing import CliRunner

from fleet_support import RAY, RayCluster, chosen_files, write_fleet

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not RAY.exists(), reason="ray is not installed (edgeopt[ray])")]


def fleet(*args):
    from edgeopt.cli import main

    return CliRunner().invoke(main, ["fleet", *map(str, args)], catch_exceptions=False)


def kill_first_build(cluster: RayCluster, killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the first Ray worker seen running a build (``ray::remote_build``) once it has run a second."""
    import psutil

    while not stop.is_set():
        for pid in cluster.own_pids():
            try:
                title = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
            if title.startswith("ray::remote_build"):
                time.sleep(1.0)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet-ray")
    path = write_fleet(root)
    local = fleet(path, "--out", root / "local", "--cache", root / "cache-local")
    cluster = RayCluster()
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=kill_first_build, args=(cluster, killed, stop), daemon=True)
    try:
        killer.start()
        with cluster.joined() as address:
            ray = fleet(path, "--out", root / "ray", "--cache", root / "cache-ray", "--executor", f"ray={address}")
        stop.set()
        killer.join()
    finally:
        cluster.stop()
    left = cluster.own_pids()
    return root, local, ray, killed, left


def test_the_ray_cluster_chooses_the_same_artifacts_as_the_local_executor(runs):
    root, local, ray, _, _ = runs
    assert local.exit_code == ray.exit_code == 4, (local.output, ray.output)  # resnet misses tight's file budget
    expected = chosen_files(root / "local")
    assert chosen_files(root / "ray") == expected
    assert expected[("digits", "tight")] and expected[("digits", "roomy")] and expected[("resnet", "roomy")]
    assert expected[("resnet", "tight")] is None
    report = json.loads((root / "ray" / "report.json").read_text())
    assert report["executor"] == {"name": "ray", "address": report["executor"]["address"], "nodes": 2,
                                  "build_slots": 2}
    assert len({e["node"] for e in report["events"] if e["kind"] == "build"}) == 2  # both nodes built


def test_a_worker_killed_mid_build_is_retried_and_leaves_the_cache_clean(runs):
    root, _, ray, killed, _ = runs
    assert len(killed) == 1, "no build worker was seen"
    report = json.loads((root / "ray" / "report.json").read_text())
    builds = [e for e in report["events"] if e["kind"] == "build"]
    assert len(builds) == 4 and killed[0] not in {e["pid"] for e in builds}  # each build completed elsewhere
    leftovers = [p.name for p in (root / "cache-ray").iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers


def test_no_measurement_overlaps_a_build_on_the_same_machine(runs):
    report = json.loads((runs[0] / "ray" / "report.json").read_text())
    events = report["events"]
    measures = [e for e in events if e["kind"] == "measure"]
    assert len(measures) == 4 and report["slot_overlaps"] == 0
    for m in measures:
        clash = [b for b in events if b["kind"] == "build" and b["host"] == m["host"]
                 and b["start"] < m["end"] and m["start"] < b["end"]]
        assert not clash, (m, clash)


def test_the_cluster_is_stopped_and_its_folder_removed(runs):
    root, _, _, _, left = runs
    assert left == []

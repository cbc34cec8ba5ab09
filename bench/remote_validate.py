"""`edgeopt validate --device` over a real SSH connection vs the same validation run locally, in one run.

Starts the test suite's throwaway OpenSSH server on 127.0.0.1 (tests/sshd_support.py; needs Debian's
openssh-server), whose "device" is this host with a Python venv holding only numpy + openvino (built as the
tests build it). The profile matches this host, so both runs measure the same machine: the verdict tables
must agree. Prints both tables, what edgeopt copies to the device (bytes), and the end-to-end time of each
run, interleaved over --rounds, as medians and their ratio (the cost of the SSH round trips and the copy).

Usage: .venv/bin/python bench/remote_validate.py [--artifact out/digits] [--rounds 3] [--runs 300]
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
sys.path.insert(0, str(ROOT / "tests"))

from sshd_support import start_sshd  # noqa: E402

from edgeopt.device.host import host_info  # noqa: E402
from edgeopt.remote.devices import load_device  # noqa: E402
from edgeopt.remote.run import lean_package, measure, measurement_bundle  # noqa: E402
from edgeopt.targets import Measuring, load_target, model_in, validate_on  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", default=str(ROOT / "out" / "digits"), help="an `edgeopt compress` folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    from bundle_support import runtime_venv
    from test_remote import PROFILE

    with tempfile.TemporaryDirectory(prefix="edgeopt-bench-ssh-") as tmp:
        tmp = Path(tmp)
        (tmp / "loopback-openvino.toml").write_text(PROFILE.format(runtime="openvino"))
        server = start_sshd(tmp / "sshd")
        try:
            python = os.path.abspath(runtime_venv("openvino") / "bin" / "python")
            (tmp / "devices.toml").write_text(
                f'[devices.local-ssh]\nhost = "127.0.0.1"\nport = {server.port}\nuser = "{server.user}"\n'
                f'profile = "loopback-openvino"\npython = "{python}"\nkey_file = "{server.user_key}"\n'
                f'known_hosts_file = "{server.known_hosts}"\nwork_dir = "{tmp / "work"}"\n')
            os.environ["EDGEOPT_TARGETS"], os.environ["EDGEOPT_DEVICES"] = str(tmp), str(tmp / "devices.toml")
            target, device = load_target("loopback-openvino"), load_device("local-ssh")
            model = model_in(args.artifact, "openvino")
            bundle = measurement_bundle(model, target, tmp / "bundle.tar.gz")
            lean = lean_package()
            print(f"host: {host_info().cpu_model}; artifact {model}; {args.runs} runs per measurement")
            print(f"copied to the device: bundle {bundle.stat().st_size / 1e3:.1f} kB (each run), lean edgeopt.device "
                  f"package {len(lean.data) / 1e3:.1f} kB ({lean.files} files, once per edgeopt version)")
            local_s, remote_s = [], []
            for _ in range(args.rounds):
                start = time.perf_counter()
                local = validate_on(target, model, measuring=Measuring(runs=args.runs))
                local_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                remote = measure(device, target, model, runs=args.runs).report
                remote_s.append(time.perf_counter() - start)
            for name, report in (("local", local), ("device over ssh", remote)):
                print(f"{name}: " + ", ".join(f"{c.name} {c.verdict}" for c in report.checks)
                      + f"; p50 {report.latency.p50_ms:.4f} ms")
            same = [c.verdict for c in local.checks] == [c.verdict for c in remote.checks]
            print(f"same verdicts: {same}")
            lm, rm = statistics.median(local_s), statistics.median(remote_s)
            print(f"end-to-end median over {args.rounds} interleaved rounds: local {lm:.2f} s, over ssh {rm:.2f} s "
                  f"(x{rm / lm:.2f}, +{rm - lm:.2f} s for connections, copy and bundling)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()

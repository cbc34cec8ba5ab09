"""``python -m edgeopt.device.facts [WORK_DIR]``: what this device is and has, as JSON on stdout — CPU, ISA
flags, memory, OS, Python, the versions of numpy and each runtime (without importing them), free disk.
Lean module: standard library only, so it answers even where numpy is missing."""

from __future__ import annotations

import os
import shutil
import sys
from importlib import metadata

from edgeopt.device.host import host_info
from edgeopt.jsonio import dumps

PACKAGES = ("numpy", "openvino", "onnxruntime")


def facts(work_dir: str = ".") -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        machine_id = open("/etc/machine-id", encoding="utf-8").read().strip()
    except OSError:
        machine_id = None
    return {"host": host_info().describe(), "hostname": os.uname().nodename, "machine_id": machine_id,
            "python_executable": sys.executable, "packages": versions,
            "work_dir": os.path.abspath(work_dir), "free_bytes": shutil.disk_usage(work_dir).free}


if __name__ == "__main__":
    print(dumps(facts(sys.argv[1] if len(sys.argv) > 1 else ".")))

"""The measuring process: ``python -m edgeopt.device.probe REQUEST.json RESULT.json``.

It runs apart from the caller so that its peak resident memory is the inference's alone (not torch's or
nncf's). It pins its CPU affinity, imports the runtime, notes its RSS, loads and compiles the model, warms up,
times the inferences and writes the raw figures as JSON. Lean: numpy, the standard library and the runtime.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from edgeopt.errors import BadInputError, first_line
from edgeopt.jsonio import dumps


def run(request: dict) -> dict:
    """Measure the model ``request`` describes (see ``validate.validate_artifact`` for the fields)."""
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])
    from edgeopt.device.measure import time_inferences
    from edgeopt.device.runtime import RuntimeSettings, format_sizes, open_session, runtime_version

    settings = RuntimeSettings(**request["settings"])
    version = runtime_version(settings.runtime)  # imports the runtime before the baseline RSS is read
    rss_before = _status_kib("VmRSS")
    start = time.perf_counter()
    session = open_session(request["model"], settings, request.get("input_shapes"))
    load_ms = (time.perf_counter() - start) * 1000
    given = request.get("input_shapes") or {}
    feeds, shapes = _feeds(session.inputs, session.recorded_shapes, given)
    try:
        timings = time_inferences(session, feeds, request["runs"], request["warmup"], request["min_seconds"])
    except BadInputError:
        raise
    except Exception as exc:  # the runtime's own types; at sizes the user gave, the sizes are what is wrong
        if not given:
            raise
        others = {name: shape for name, shape in shapes.items() if name not in given}
        raise BadInputError(f"the model does not run at input shapes {format_sizes(shapes)}"
                            + (f" ({format_sizes(others)} recorded by edgeopt, not given)" if others else "")
                            + f": {first_line(exc, 200)}; give each input's shape with --input-shape") from exc
    peak = _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "runtime_version": version,
        "effective_settings": session.effective_settings(),
        "input_shapes": shapes,
        "load_compile_ms": load_ms,
        "first_inference_ms": timings.first_ms,
        "timings_ms": timings.wall_ms,
        "runtime_timings_ms": timings.runtime_ms,
        "rss_before_load_bytes": rss_before * 1024 if rss_before else None,
        "peak_rss_bytes": peak * 1024 if peak else None,
        "cpus": sorted(os.sched_getaffinity(0)),
        "kernels": session.kernels(),
        "bound_outputs": session.bound_outputs,
    }


def _feeds(inputs, recorded: dict, given: dict) -> tuple[dict, dict]:
    """Random inputs; dynamic dimensions are filled from the sizes ``given`` (name -> list of ints), over those
    the file ``recorded``."""
    from edgeopt.device.runtime import TensorSpec, format_shape, one_input_alias, random_feeds

    given = one_input_alias([spec.name for spec in inputs], given)
    unknown = sorted(set(given) - {spec.name for spec in inputs})
    if unknown:
        raise BadInputError(f"input shapes given for unknown input(s) {', '.join(unknown)}; the model's inputs are "
                            f"{', '.join(spec.name for spec in inputs)}")
    shapes = {**recorded, **given}
    concrete = []
    for spec in inputs:
        given = shapes.get(spec.name)
        if given is not None:
            if len(given) != len(spec.shape) or any(d is not None and d != g for d, g in zip(spec.shape, given)):
                raise BadInputError(f"input shape {spec.name}={format_shape(tuple(given))} does not fit the model's "
                                    f"{format_shape(spec.shape)}")
            spec = TensorSpec(spec.name, tuple(given), spec.dtype)
        elif not spec.is_static:
            raise BadInputError(f"input '{spec.name}' has a dynamic shape {format_shape(spec.shape)}; give its shape "
                                f"(--input-shape {spec.name}=..., or input_shapes in the target profile)")
        concrete.append(spec)
    return random_feeds(concrete), {spec.name: list(spec.shape) for spec in concrete}


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def main(argv: list[str] | None = None) -> int:
    request_path, result_path = (argv or sys.argv[1:])[:2]
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    try:
        result = run(request)
        code = 0
    except BadInputError as exc:
        result, code = {"error": str(exc)}, 2
    with open(result_path, "w", encoding="utf-8") as handle:
        handle.write(dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())

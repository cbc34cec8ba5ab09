"""edgeopt: target-aware compression, conversion and validation of neural networks for edge devices.

Public API (imported lazily so that ``edgeopt.device`` stays free of torch and nncf)::

    import edgeopt
    result = edgeopt.compress("model.onnx", "calib.npz", out="out/", recipe="int8")
    result = edgeopt.compress("model.onnx", "calib.npz", out="out/", target="raspberry-pi-4")
    report = edgeopt.validate("out/", target="raspberry-pi-4")

    @edgeopt.metric(primary="f1", max_drop=0.02)     # a task metric for the quality gate (docs/metrics.md)
    def f1(outputs, targets): ...
"""

__version__ = "0.1.0"

_LAZY = {
    "compress": "edgeopt.api",
    "validate": "edgeopt.api",
    "optimize": "edgeopt.api",
    "CompressResult": "edgeopt.pipeline",
    "Measuring": "edgeopt.targets",
    "Target": "edgeopt.targets",
    "load_target": "edgeopt.targets",
    "load_model": "edgeopt.source",
    "load_samples": "edgeopt.data",
    "parse_recipe": "edgeopt.recipe",
    "QualityGate": "edgeopt.evaluate",
    "metric": "edgeopt.device.task_metric",
    "MetricSpec": "edgeopt.device.task_metric",
    "load_metric": "edgeopt.user_metric",
    "RuntimeSettings": "edgeopt.device.runtime",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edgeopt' has no attribute '{name}'")

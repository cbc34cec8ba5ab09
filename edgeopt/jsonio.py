"""Strict JSON for every file and stream edgeopt writes: no ``NaN``/``Infinity`` (which most JSON parsers
reject). A figure that is not a finite number (not measurable) is written as ``null``."""

from __future__ import annotations

import json
import math


def dumps(data, **kwargs) -> str:
    """``json.dumps`` with ``allow_nan=False``, non-finite floats replaced by ``None`` first."""
    return json.dumps(finite(data), allow_nan=False, **kwargs)


def finite(value):
    """``value`` with every non-finite float (at any depth) replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value

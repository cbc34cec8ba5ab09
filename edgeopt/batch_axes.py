"""Which axis of each model input holds the batch.

Given as ``--batch-axis NAME=AXIS`` (``NAME=none`` for an input without one), by a profile's
``[model] batch_axes``, or read off the model: a dimension named like a batch (``batch``, ``N``, ``B``), else
axis 0 when it is dynamic or 1, else the first dynamic dimension, else the first dimension of size 1 — so a
recurrent state ``[2, B, 128]`` is batched on axis 1. A rank-0 input (a sample rate, a step counter) has none.
The batch axis says where data files stack samples and which dynamic dimension defaults to 1.
"""

from __future__ import annotations

import re

from edgeopt.errors import BadInputError

_BATCH_NAME = re.compile(r"batch|^(n|b|bs|bsz)$", re.IGNORECASE)


def model_batch_axis(dims: list[tuple[int | None, str | None]]) -> int | None:
    """The batch axis of an input declared with ``dims``: (static size or None, symbolic name or None) each."""
    if not dims:
        return None
    named = [i for i, (_, name) in enumerate(dims) if name and _BATCH_NAME.search(name)]
    if named:
        return named[0]
    if dims[0][0] in (None, 1):
        return 0
    dynamic = [i for i, (size, _) in enumerate(dims) if size is None]
    if dynamic:
        return dynamic[0]
    ones = [i for i, (size, _) in enumerate(dims) if size == 1]
    return ones[0] if ones else 0


def parse_batch_axes(values: tuple[str, ...] | list[str]) -> dict[str, int | None]:
    """Parse ``name=1`` / ``name=none`` options into a dict."""
    axes: dict[str, int | None] = {}
    for value in values:
        name, sep, axis = value.partition("=")
        axis = axis.strip().lower()
        if not sep or not name.strip() or not (axis == "none" or axis.isdigit()):
            raise BadInputError(f"--batch-axis '{value}': expected NAME=AXIS (e.g. state=1) or NAME=none")
        axes[name.strip()] = None if axis == "none" else int(axis)
    return axes


def check_batch_axis(where: str, name: str, axis: int | None, rank: int) -> None:
    if axis is not None and not 0 <= axis < rank:
        raise BadInputError(f"{where}: batch axis {axis} of input '{name}' is outside its {rank} dimension(s)")

"""``compress`` options for weight-only compression (``--weights MODE`` and its knobs) → a ``weights`` step."""

from __future__ import annotations

import click

from edgeopt.errors import BadInputError
from edgeopt.passes.weights import BACKUP, MODES, SENSITIVITY

_OPTIONS = [
    click.option("--weights", "weights_mode", type=click.Choice(["auto", *MODES]), default=None,
                 help="Weight-only compression (nncf.compress_weights); auto: INT4 for transformers on memory-tight "
                      "--target profiles, INT8 otherwise."),
    click.option("--group-size", type=int, default=None, help="With --weights int4_*: input channels per scale "
                 "(default 128; -1 per channel)."),
    click.option("--ratio", type=float, default=None, help="With --weights int4_*: share of weights in INT4, the "
                 "rest in the backup precision (default 1.0)."),
    click.option("--sensitivity", type=click.Choice(SENSITIVITY), default=None,
                 help="With --ratio < 1: how layers are ranked for INT4 (activation metrics use --calib)."),
    click.option("--backup", type=click.Choice(BACKUP), default=None,
                 help="With --weights int4_*: precision of the layers kept out of INT4 (default int8_asym)."),
    click.option("--all-layers", is_flag=True, default=None, help="With --weights int4_*: INT4 for the embedding "
                 "and last layer too (default: they stay in the backup precision)."),
    click.option("--awq", is_flag=True, default=None, help="With --weights int4_*: AWQ (data-aware, uses --calib)."),
    click.option("--scale-estimation", is_flag=True, default=None,
                 help="With --weights int4_*: scale estimation (data-aware, uses --calib)."),
    click.option("--gptq", is_flag=True, default=None, help="With --weights int4_*: GPTQ (data-aware, uses --calib)."),
]
# CLI option -> ``weights`` step parameter
_PARAMS = {"group_size": "group_size", "ratio": "ratio", "sensitivity": "sensitivity_metric",
           "backup": "backup_mode", "all_layers": "all_layers", "awq": "awq", "scale_estimation": "scale_estimation",
           "gptq": "gptq"}


def weight_options(command):
    """Decorator: add the weight-compression options to a click command."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def weights_step(args: dict):
    """The ``weights`` recipe step the options ask for, or ``None`` without ``--weights`` (mode=auto sees the
    ``--target`` profile through the pass context)."""
    from edgeopt.recipe import make_step

    given = {param: args[option] for option, param in _PARAMS.items() if args.get(option) is not None}
    mode = args.get("weights_mode")
    if mode is None:
        if given:
            flags = ", ".join("--" + option.replace("_", "-") for option in _PARAMS if args.get(option) is not None)
            raise BadInputError(f"{flags}: need --weights MODE")
        return None
    return make_step("weights", {"mode": mode, **given}, source="--weights")

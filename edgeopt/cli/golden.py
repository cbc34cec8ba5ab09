"""``edgeopt golden create``: a golden set of inputs, reference outputs and the task metric's value."""

from __future__ import annotations

import click

from edgeopt.cli.out_options import force_option, guard_outputs


@click.group()
def golden() -> None:
    """Golden sets: reference outputs that artifacts are checked against (docs/golden.md)."""


@golden.command("create")
@click.argument("model")
@click.option("--data", required=True, help="The inputs (and targets): .npz, image folder, file.py:fn, ... "
              "(the first --samples of them are kept).")
@click.option("--out", required=True, type=click.Path(), help="Golden set folder to write (atomically).")
@click.option("--metric", default=None, metavar="FILE.py:FUNCTION",
              help="Task metric (docs/metrics.md): its value on the reference is stored, and its file too when "
                   "it imports only numpy and the standard library (so a device can evaluate it).")
@click.option("--max-drop", default=None, type=click.FloatRange(min=0),
              help="With --metric: largest allowed drop in the metric's units (default: what it declares).")
@click.option("--max-rel-drop", default=None, type=click.FloatRange(min=0),
              help="With --metric: largest allowed drop as a fraction of the reference's value.")
@click.option("--samples", default=32, show_default=True, type=click.IntRange(min=1),
              help="How many samples to keep.")
@click.option("--min-cosine", default=0.99, show_default=True, type=click.FloatRange(-1, 1),
              help="Tolerance of every output: smallest mean cosine similarity to the reference.")
@click.option("--max-abs-error", "max_abs", multiple=True, metavar="OUTPUT=VALUE",
              help="Tolerance of one output: largest absolute difference to the reference (repeatable).")
@click.option("--input-shape", "input_shapes", multiple=True, help="NAME=D1,D2,... for dynamic inputs.")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@force_option
def create(model, data, out, metric, max_drop, max_rel_drop, samples, min_cosine, max_abs, input_shapes, quiet,
           force):
    """Run MODEL (the reference) on DATA and store inputs, outputs, tolerances and the metric's value in OUT.

    Exit 0 ok, 2 bad input (a metric hook that fails or returns no finite number included).
    """
    from edgeopt.errors import BadInputError
    from edgeopt.golden import create_golden
    from edgeopt.source import parse_input_shapes
    from edgeopt.user_metric import load_metric

    guard_outputs(out, force)
    if (max_drop is not None or max_rel_drop is not None) and metric is None:
        raise BadInputError("--max-drop and --max-rel-drop need --metric")
    bounds = {}
    for item in max_abs:
        name, sep, value = item.partition("=")
        try:
            bounds[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise BadInputError(f"--max-abs-error: expected OUTPUT=VALUE, got {item!r}")
    spec = load_metric(metric, max_drop=max_drop, max_rel_drop=max_rel_drop) if metric else None
    created = create_golden(model, data, out, metric=spec, samples=samples, min_cosine=min_cosine,
                            max_abs_error=bounds, input_shapes=parse_input_shapes(input_shapes))
    for note in created.notes:
        click.echo(f"edgeopt: note: {note}", err=True)
    if not quiet:
        value = created.metric["reference"] if created.metric else None
        about = f"; {value['primary']} = {value['value']:.6g}" if value else ""
        click.echo(f"{created.out}: {created.samples} samples{about}"
                   + (" (metric file included)" if created.shipped_metric else ""))

"""The quality-gate options shared by `compress` and `optimize`."""

from __future__ import annotations

import click

_OPTIONS = (
    click.option("--max-drop", default=None, type=click.FloatRange(min=0),
                 help="Quality gate: largest allowed top-1 drop, in percentage points (default 1); with --metric, "
                      "the metric's largest allowed drop in its own units (default: what the metric declares)."),
    click.option("--metric", default=None, metavar="FILE.py:FUNCTION",
                 help="Quality gate on your task metric: FUNCTION(outputs, targets) returns a number or a dict of "
                      "named numbers (docs/metrics.md); it then decides alone (top-1 and cosine are still reported)."),
    click.option("--max-rel-drop", default=None, type=click.FloatRange(min=0),
                 help="With --metric: largest allowed drop as a fraction of the original's value (0.01 = 1%)."),
    click.option("--min-cosine", default=None, type=click.FloatRange(-1, 1),
                 help="Quality gate: smallest allowed cosine similarity to the original outputs (default 0.99). "
                      "With labels, top-1 judges the labelled output and the cosine the others; given here, the "
                      "cosine judges the labelled output too."),
    click.option("--min-token-agreement", default=0.9, show_default=True, type=click.FloatRange(0, 1),
                 help="Quality gate for a language model: smallest allowed top-1 next-token agreement with the "
                      "original."),
    click.option("--max-perplexity-ratio", default=1.1, show_default=True, type=click.FloatRange(min=1),
                 help="Quality gate for a language model: largest allowed perplexity, as a multiple of the "
                      "original's."),
    click.option("--outputs", "gate_outputs", default=None,
                 help="Comma-separated names of the outputs the quality gate looks at (default: every output; "
                      "the worst one decides). Every output is measured and reported either way."),
)


def gate_options(command):
    """Decorator adding the gate options; the command receives them as ``gate_args`` via ``quality_gate``."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def quality_gate(max_drop: float | None, min_cosine: float | None, min_token_agreement: float,
                 max_perplexity_ratio: float,
                 outputs: str | None = None, metric: str | None = None, max_rel_drop: float | None = None):
    """The ``QualityGate`` the options describe; ``--metric`` is imported now, so a bad file fails first."""
    from edgeopt.errors import BadInputError
    from edgeopt.evaluate import QualityGate
    from edgeopt.user_metric import load_metric

    if max_rel_drop is not None and metric is None:
        raise BadInputError("--max-rel-drop needs --metric (top-1's allowed drop is --max-drop, in points)")
    names = tuple(dict.fromkeys(n.strip() for n in (outputs or "").split(",") if n.strip()))
    spec = load_metric(metric, max_drop=max_drop, max_rel_drop=max_rel_drop) if metric else None
    top1_drop = 1.0 if max_drop is None or spec is not None else max_drop
    return QualityGate(max_drop=top1_drop / 100.0, min_cosine=0.99 if min_cosine is None else min_cosine,
                       min_token_agreement=min_token_agreement, max_perplexity_ratio=max_perplexity_ratio,
                       outputs=names, metric=spec, cosine_on_labelled=min_cosine is not None)

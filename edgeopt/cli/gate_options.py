"""The quality-gate options shared by `compress` and `optimize`."""

from __future__ import annotations

import click

_OPTIONS = (
    click.option("--max-drop", default=1.0, show_default=True, type=click.FloatRange(min=0),
                 help="Quality gate: largest allowed top-1 drop, in percentage points."),
    click.option("--min-cosine", default=0.99, show_default=True, type=click.FloatRange(-1, 1),
                 help="Quality gate without labels: smallest allowed cosine similarity to the original outputs."),
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


def quality_gate(max_drop: float, min_cosine: float, min_token_agreement: float, max_perplexity_ratio: float,
                 outputs: str | None = None):
    from edgeopt.evaluate import QualityGate

    names = tuple(dict.fromkeys(n.strip() for n in (outputs or "").split(",") if n.strip()))
    return QualityGate(max_drop=max_drop / 100.0, min_cosine=min_cosine, min_token_agreement=min_token_agreement,
                       max_perplexity_ratio=max_perplexity_ratio, outputs=names)

"""Quality: top-1 accuracy (labelled data) or output fidelity vs the original, or the user's task metric, and
the gate on the drop.

Every output counts: fidelity is measured per output, and the gate looks at the worst of the outputs it is told
to (all by default). Top-1 agreement is reported only for outputs that are classifiers (a score per class).
With a task metric (``--metric file.py:function``, docs/metrics.md) the metric alone decides; fidelity and top-1
are still measured and reported.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.device.agreement import finite_pairs, row_cosines, sample_cosines
from edgeopt.device.runtime import RuntimeSettings, open_session, runtime_for
from edgeopt.device.task_metric import MetricCheck, MetricSpec, MetricValues
from edgeopt.errors import BadInputError

EVAL_SETTINGS = RuntimeSettings(inference_precision="f32", threads=None)  # how artifacts are run for quality


@dataclass(frozen=True)
class Fidelity:
    """How closely one output follows the reference's, over all samples."""

    cosine: float  # mean over samples of the cosine similarity of the flattened output (one value per sample:
    # the cosine of all samples' values around the reference's mean, ``centred_cosine``)
    max_abs_error: float
    mean_abs_error: float
    top1_agreement: float | None  # share of samples whose argmax matches (classifier outputs only)
    output: str | None = None  # the output's name
    non_finite: int = 0  # samples whose output is inf or NaN where the original's is finite (cosine 0 each)


@dataclass(frozen=True)
class Quality:
    name: str
    top1: float | None  # accuracy in [0, 1] when labels exist
    fidelity: Fidelity | None  # vs the original: the worst gated output (None for the original itself)
    tokens: TokenFidelity | None = None  # next-token agreement and perplexity, for language models
    outputs: tuple[Fidelity, ...] = ()  # every output, in the model's order
    top1_output: str | None = None  # the output the labels are scored on
    metric: MetricValues | None = None  # the task metric's values, when the gate has one

    def describe(self) -> dict:
        described = asdict(self)
        described["outputs"] = {f.output: asdict(f) for f in self.outputs}
        described["metric"] = self.metric.describe() if self.metric else None
        return described

    @classmethod
    def from_dict(cls, data: dict) -> "Quality":
        """The inverse of ``describe`` (reports read back from a cache)."""
        fidelity, tokens, metric = data.get("fidelity"), data.get("tokens"), data.get("metric")
        outputs = tuple(Fidelity(**f) for f in (data.get("outputs") or {}).values())
        return cls(data["name"], data.get("top1"), Fidelity(**fidelity) if fidelity else None,
                   TokenFidelity(**tokens) if tokens else None, outputs, data.get("top1_output"),
                   MetricValues.from_dict(metric) if metric else None)


@dataclass(frozen=True)
class QualityGate:
    """Passes when top-1 drops by at most ``max_drop`` (absolute, in [0, 1]) or, without labels, when the
    cosine similarity to the original stays at least ``min_cosine``. A language model must also keep its top-1
    next-token agreement at least ``min_token_agreement`` and its perplexity within ``max_perplexity_ratio`` of
    the original's. With a task ``metric`` only the metric decides: its primary value may drop by at most the
    metric's allowed drop."""

    max_drop: float = 0.01
    min_cosine: float = 0.99
    min_token_agreement: float = 0.9
    max_perplexity_ratio: float = 1.1
    outputs: tuple[str, ...] = ()  # the outputs that matter (default: every output)
    metric: MetricSpec | None = None  # the user's task metric (replaces top-1, cosine and token checks)
    cosine_on_labelled: bool = False  # the cosine also on the output top-1 is scored on (a --min-cosine given)

    def describe(self) -> dict:
        return {"max_top1_drop": self.max_drop, "min_cosine": self.min_cosine, "outputs": list(self.outputs) or "all",
                "cosine_on_labelled_output": self.cosine_on_labelled,
                "language_model": {"min_token_agreement": self.min_token_agreement,
                                   "max_perplexity_ratio": self.max_perplexity_ratio},
                "metric": self.metric.describe() if self.metric else None}

    def metric_check(self, reference: Quality, candidate: Quality) -> MetricCheck | None:
        """The task metric's verdict, when the gate has a metric and both qualities carry its values."""
        if self.metric is None or reference.metric is None or candidate.metric is None:
            return None
        return self.metric.judge(reference.metric, candidate.metric)

    def gated(self, quality: Quality) -> list[Fidelity]:
        """The per-output fidelities the gate looks at."""
        return [f for f in quality.outputs if not self.outputs or f.output in self.outputs]

    def check(self, reference: Quality, candidate: Quality) -> tuple[bool, str]:
        """Top-1 drop on the labelled output when labels exist; cosine on every other gated output (the worst
        one decides; on the labelled one too with ``cosine_on_labelled``); a gated output giving inf or NaN where
        the original's is finite fails; with a task metric, the metric alone."""
        checked = self.metric_check(reference, candidate)
        if checked is not None:
            return checked.passed, checked.message()
        gated = self.gated(candidate) or ([candidate.fidelity] if candidate.fidelity else [])
        verdict, parts = True, []
        if reference.top1 is not None and candidate.top1 is not None:
            drop = reference.top1 - candidate.top1
            verdict = drop <= self.max_drop + 1e-12
            parts.append(f"top-1 drop {drop * 100:.2f} pp (max {self.max_drop * 100:.2f} pp)")
            if not self.cosine_on_labelled:
                gated = [f for f in gated if f.output != candidate.top1_output]
        if gated:
            worst = min(gated, key=lambda f: f.cosine)
            where = f" on output '{worst.output}' (worst of {len(gated)})" if len(gated) > 1 else ""
            if len(candidate.outputs) > 1 and len(gated) == 1:
                where = f" on output '{worst.output}'"
            verdict = verdict and worst.cosine >= self.min_cosine
            parts.append(f"cosine {worst.cosine:.5f} (min {self.min_cosine}){where}")
        for broken in (f for f in self.gated(candidate) if f.non_finite):  # never within any tolerance
            verdict = False
            parts.append(f"output '{broken.output}' gives inf or NaN on {broken.non_finite} sample(s) where the "
                         "original's is finite")
        verdict = verdict, "; ".join(parts)
        if candidate.tokens is None:
            return verdict
        ok, message = candidate.tokens.check(self.min_token_agreement, self.max_perplexity_ratio)
        return verdict[0] and ok, f"{verdict[1]}; {message}"


@dataclass
class Outputs:
    """Every output of a model over a sample set: per output, a samples x values array, its name and the shape
    one sample gives."""

    names: list[str]
    values: list[np.ndarray]
    shapes: list[tuple[int, ...]] = field(default_factory=list)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def per_sample(self) -> list[dict[str, np.ndarray]]:
        """One dict of arrays (by output name, each as one sample gives it) per sample: what a metric reads."""
        return [{n: v[i].reshape(s) for n, v, s in zip(self.names, self.values, self.shapes)}
                for i in range(len(self.values[0]) if self.values else 0)]


def output_names(names: list[str], count: int) -> list[str]:
    """The model's output names, or positional ones when it names none (or not all)."""
    return list(names) if len(names) == count else ["output"] if count == 1 else [f"output{i}" for i in range(count)]


def all_outputs(predict, samples: SampleSet, names: list[str]) -> Outputs:
    """Run ``predict(feeds) -> list[array]`` on every sample; stack each output (named by position)."""
    per_sample = [[np.asarray(o) for o in predict(sample)] for sample in samples.samples]
    count = len(per_sample[0])
    names = output_names(names, count)
    values = [np.concatenate([outs[i].reshape(1, -1) for outs in per_sample]) for i in range(count)]
    return Outputs(names, values, [per_sample[0][i].shape for i in range(count)])


_CLASSIFIER_NAME = re.compile(r"logit|prob|class|score|cls|label", re.IGNORECASE)


def class_count(shape: tuple[int, ...]) -> int | None:
    """The classes an output of this per-sample ``shape`` scores, when it is one row of at least two values
    (``[1, C]``, or ``[C]`` from a model that squeezed its batch axis away: madmom's key CNN gives ``[24]``)."""
    row = shape[1:] if len(shape) == 2 and shape[0] == 1 else shape if len(shape) == 1 else ()
    return row[0] if row and row[0] >= 2 else None


def classifier_outputs(reference: Outputs) -> set[str]:
    """Outputs that give a score per class (:func:`class_count`), and either probabilities (non-negative rows
    summing to 1) or a name that says so (logits, probs, scores, class)."""
    found = set()
    for name, values, shape in zip(reference.names, reference.values, reference.shapes):
        if class_count(shape) is None:
            continue
        probabilities = bool(np.all(values >= -1e-6) and np.allclose(values.sum(axis=1), 1.0, atol=1e-3))
        if probabilities or _CLASSIFIER_NAME.search(name):
            found.add(name)
    return found


_FEATURES_NAME = re.compile(r"hidden|pooler|embed|feature|state", re.IGNORECASE)


def labelled_output(reference: Outputs, gated: tuple[str, ...] = ()) -> str | None:
    """The output labels are scored on: the first gated output that says it is a classifier (probabilities, or a
    name such as logits: ``classifier_outputs``), else the model's only output shaped like scores per class (a row
    of at least two values per sample, not named as features or state such as ``pooler_output``) when it is
    gated; None when there is no such output, or several to guess from."""
    shaped = [n for n in reference.names if class_count(reference.shapes[reference.index(n)])
              and not _FEATURES_NAME.search(n)]
    candidates = [n for n in shaped if not gated or n in gated]
    classifiers = classifier_outputs(reference)
    only = shaped[0] if len(shaped) == 1 and shaped == candidates else None
    return next((n for n in candidates if n in classifiers), only)


def _label_outside(labels: np.ndarray, reference: Outputs, output: str) -> str | None:
    """Why the labels cannot be class indices of ``output``, or None when they can."""
    classes = class_count(reference.shapes[reference.index(output)])
    outside = [int(v) for v in (labels.min(), labels.max()) if not 0 <= int(v) < classes] if labels.size else []
    return (f"label {outside[-1]} is not a class of output '{output}', which scores {classes} classes "
            f"(0..{classes - 1})") if outside else None


def measure_outputs(name: str, outputs: Outputs, labels: np.ndarray | None, reference: Outputs | None, *,
                    gated: tuple[str, ...] = (), token_ids: np.ndarray | None = None,
                    metric: MetricSpec | None = None, targets: list | None = None) -> Quality:
    """Quality of ``outputs`` against the labels and, per output, against ``reference`` (the original's);
    ``token_ids`` (from ``language_model_ids``) adds next-token fidelity on the first output; ``metric`` (a task
    metric) is evaluated on every output and the data's ``targets``."""
    from edgeopt.user_metric import evaluate_metric

    basis = reference or outputs
    labelled = labelled_output(basis, gated) if labels is not None else None
    outside = _label_outside(labels, basis, labelled) if labelled is not None else None
    if outside and metric is None:
        raise BadInputError(outside)
    labelled = None if outside else labelled  # a task metric takes the labels as its targets: no top-1 then
    top1 = (float(np.mean(outputs.values[basis.index(labelled)].argmax(axis=1) == labels))
            if labelled is not None else None)
    values = evaluate_metric(metric, outputs.per_sample(), targets) if metric is not None else None
    if reference is None:
        return Quality(name, top1, None, top1_output=labelled, metric=values)
    classifiers = classifier_outputs(reference) | ({labelled} if labelled else set())
    per_output = tuple(compare_outputs(o, r, output=n, classifier=n in classifiers)
                       for n, o, r in zip(reference.names, outputs.values, reference.values))
    considered = [f for f in per_output if not gated or f.output in gated] or list(per_output)
    worst = min(considered, key=lambda f: f.cosine)
    tokens = (next_token_fidelity(outputs.values[0], reference.values[0], token_ids)
              if token_ids is not None else None)
    return Quality(name, top1, worst, tokens, per_output, labelled, values)


def original_predictor(source, settings: RuntimeSettings):
    """The original model (an ``edgeopt.source.SourceModel``) as ``predict(feeds) -> list[array]``: in its own
    framework, or the runtime its format is native to."""
    if source.kind == "torch":
        return torch_predictor(source.torch_module, source.input_names)
    native = runtime_for(source.path)  # the original in the runtime its format is native to
    return session_predictor(source.path, settings if native == settings.runtime else RuntimeSettings(runtime=native))


def session_predictor(path, settings: RuntimeSettings):
    session = open_session(path, settings)
    return session.infer


def torch_predictor(module, input_names: list[str]):
    import torch

    if isinstance(module, torch.export.ExportedProgram):  # a program is run as the module it holds
        module = module.module()

    def predict(feeds: dict) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*(torch.from_numpy(feeds[name]) for name in input_names))
        out = out if isinstance(out, (tuple, list)) else (out,)
        return [o.detach().numpy() for o in out]

    return predict


def language_model_ids(predict, samples: SampleSet) -> np.ndarray | None:
    """The token ids (samples x positions) when the model is a language model, i.e. maps one integer input of
    shape 1 x T to per-position logits 1 x T x V; otherwise ``None``."""
    first = samples.samples[0]
    ids = next(iter(first.values()))
    if len(first) != 1 or ids.ndim != 2 or ids.shape[0] != 1 or not np.issubdtype(ids.dtype, np.integer):
        return None
    logits = np.asarray(predict(first)[0])
    if logits.ndim != 3 or logits.shape[:2] != ids.shape or logits.shape[2] < 2:
        return None
    return np.concatenate([next(iter(sample.values())) for sample in samples.samples])


CENTRED_MIN_SPREAD = 1e-3  # of the reference's RMS: below it, one value per sample is compared uncentred
CENTRED_MIN_SAMPLES = 4


def centred_cosine(values: np.ndarray, reference: np.ndarray) -> float:
    """Cosine of ``values`` and ``reference`` (one number per sample) around the reference's mean: how well they
    follow the reference's variation, an offset counting against them. Uncentred, scores that cluster away from
    zero read near 1 whatever they do: DNSMOS's P.808 head (MOS 2.1-3.1), quantized, read 0.998 with MOS errors
    up to 0.52 and a correlation of 0.90. A reference that hardly varies (its spread below ``CENTRED_MIN_SPREAD``
    of its RMS: a saturated sigmoid's 1.0 and 0.99999994), or fewer than ``CENTRED_MIN_SAMPLES`` samples, is
    compared uncentred: centring would compare rounding noise with rounding noise."""
    rms = float(np.sqrt(np.mean(reference ** 2)))
    if len(reference) < CENTRED_MIN_SAMPLES or reference.std() <= CENTRED_MIN_SPREAD * rms:
        return float(sample_cosines(values[None], reference[None])[0])
    mean = reference.mean()
    return float(sample_cosines((values - mean)[None], (reference - mean)[None])[0])


def compare_outputs(outputs: np.ndarray, reference: np.ndarray, output: str | None = None,
                    classifier: bool | None = None) -> Fidelity:
    """Fidelity of ``outputs`` (samples x ...) to ``reference``; top-1 agreement for a classifier output (by
    default: any output of more than one value per sample). The cosine is per sample, except for an output of one
    value per sample (a VAD's speech probability, a score): the cosine of one number is only its sign, so those
    are compared as one vector across the samples, centred on the reference's mean (:func:`centred_cosine`)."""
    a, b, broken, kept = finite_pairs(outputs, reference)
    if a.shape[1] == 0:  # an empty output: nothing to disagree on
        return Fidelity(1.0, 0.0, 0.0, None, output)
    clean = ~broken  # a broken sample (inf or NaN the reference lacks) scores cosine 0 and disagrees
    scalar = a.shape[1] == 1 and len(a) > 1
    if scalar:  # the samples whose reference is not finite are left out
        rows, considered = clean & kept[:, 0], kept[:, 0]
        cosine = (centred_cosine(a[rows, 0], b[rows, 0]) * float(clean[considered].mean()) if rows.any()
                  else 1.0 if not considered.any() else 0.0)
    else:
        cosine = float(np.where(broken, 0.0, row_cosines(a, b)).mean())
    errors = np.abs(a - b)[clean[:, None] & kept]  # the compared positions of the finite samples
    largest = float(errors.max()) if errors.size else float("inf") if broken.any() else 0.0
    classifier = a.shape[1] > 1 if classifier is None else classifier
    agreement = (float(np.mean((np.where(kept, a, -np.inf).argmax(axis=1) == np.where(kept, b, -np.inf).argmax(axis=1))
                               & clean)) if classifier and not scalar and a.shape[1] > 1 else None)
    return Fidelity(cosine, largest, float(errors.mean()) if errors.size else largest, agreement, output,
                    int(broken.sum()))


@dataclass(frozen=True)
class TokenFidelity:
    """A language model's next-token predictions vs the original's, over every position of held-out text."""

    top1_agreement: float  # share of positions whose most likely next token matches the original's
    perplexity: float  # exp(mean negative log-likelihood of the actual next token)
    reference_perplexity: float

    @property
    def perplexity_ratio(self) -> float:
        return self.perplexity / self.reference_perplexity

    def check(self, min_agreement: float, max_perplexity_ratio: float) -> tuple[bool, str]:
        ok = self.top1_agreement >= min_agreement and self.perplexity_ratio <= max_perplexity_ratio
        return ok, (f"top-1 next-token agreement {self.top1_agreement:.4f} (min {min_agreement}), perplexity "
                    f"{self.perplexity:.3f} vs {self.reference_perplexity:.3f} = {self.perplexity_ratio:.4f}x "
                    f"(max {max_perplexity_ratio}x)")


def next_token_fidelity(logits: np.ndarray, reference_logits: np.ndarray, ids: np.ndarray) -> TokenFidelity:
    """Compare (samples x positions x vocab) logits on token ``ids`` (samples x positions); position t predicts
    token t + 1, so perplexity uses the first positions - 1 predictions of each sample."""
    logits = logits.reshape(*ids.shape, -1).astype(np.float64)
    reference_logits = reference_logits.reshape(*ids.shape, -1).astype(np.float64)
    agreement = float(np.mean(logits.argmax(-1) == reference_logits.argmax(-1)))

    def perplexity(values: np.ndarray) -> float:
        shifted = values[:, :-1] - values[:, :-1].max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, ids[:, 1:, None], axis=-1)
        return float(np.exp(-picked.mean()))

    return TokenFidelity(agreement, perplexity(logits), perplexity(reference_logits))

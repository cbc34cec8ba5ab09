"""Quality: top-1 accuracy (labelled data) or output fidelity vs the original, and the gate on the drop."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.device.runtime import RuntimeSettings, open_session


@dataclass(frozen=True)
class Fidelity:
    """How closely outputs follow the reference's, over all samples of the first output."""

    cosine: float
    max_abs_error: float
    mean_abs_error: float
    top1_agreement: float | None  # share of samples whose argmax matches (classifier-shaped outputs)


@dataclass(frozen=True)
class Quality:
    name: str
    top1: float | None  # accuracy in [0, 1] when labels exist
    fidelity: Fidelity | None  # vs the original (None for the original itself)
    tokens: TokenFidelity | None = None  # next-token agreement and perplexity, for language models

    def describe(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Quality":
        """The inverse of ``describe`` (reports read back from a cache)."""
        fidelity, tokens = data.get("fidelity"), data.get("tokens")
        return cls(data["name"], data.get("top1"), Fidelity(**fidelity) if fidelity else None,
                   TokenFidelity(**tokens) if tokens else None)


@dataclass(frozen=True)
class QualityGate:
    """Passes when top-1 drops by at most ``max_drop`` (absolute, in [0, 1]) or, without labels, when the
    cosine similarity to the original stays at least ``min_cosine``. A language model must also keep its top-1
    next-token agreement at least ``min_token_agreement`` and its perplexity within ``max_perplexity_ratio`` of
    the original's."""

    max_drop: float = 0.01
    min_cosine: float = 0.99
    min_token_agreement: float = 0.9
    max_perplexity_ratio: float = 1.1

    def check(self, reference: Quality, candidate: Quality) -> tuple[bool, str]:
        if reference.top1 is not None and candidate.top1 is not None:
            drop = reference.top1 - candidate.top1
            ok = drop <= self.max_drop + 1e-12
            verdict = ok, f"top-1 drop {drop * 100:.2f} pp (max {self.max_drop * 100:.2f} pp)"
        else:
            cosine = candidate.fidelity.cosine
            verdict = cosine >= self.min_cosine, f"cosine {cosine:.5f} (min {self.min_cosine})"
        if candidate.tokens is None:
            return verdict
        ok, message = candidate.tokens.check(self.min_token_agreement, self.max_perplexity_ratio)
        return verdict[0] and ok, f"{verdict[1]}; {message}"


def first_outputs(predict, samples: SampleSet) -> np.ndarray:
    """Run ``predict(feeds) -> list[array]`` on every sample; stack the first output."""
    return np.concatenate([np.asarray(predict(sample)[0]).reshape(1, -1) for sample in samples.samples])


def session_predictor(path, settings: RuntimeSettings):
    session = open_session(path, settings)
    return session.infer


def torch_predictor(module, input_names: list[str]):
    import torch

    def predict(feeds: dict) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*(torch.from_numpy(feeds[name]) for name in input_names))
        out = out if isinstance(out, (tuple, list)) else (out,)
        return [o.detach().numpy() for o in out]

    return predict


def measure_quality(name: str, outputs: np.ndarray, labels: np.ndarray | None,
                    reference_outputs: np.ndarray | None, token_ids: np.ndarray | None = None) -> Quality:
    """``token_ids`` (from ``language_model_ids``) adds next-token fidelity for a language model."""
    top1 = float(np.mean(outputs.argmax(axis=1) == labels)) if labels is not None else None
    fidelity = compare_outputs(outputs, reference_outputs) if reference_outputs is not None else None
    tokens = (next_token_fidelity(outputs, reference_outputs, token_ids)
              if token_ids is not None and reference_outputs is not None else None)
    return Quality(name, top1, fidelity, tokens)


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


def compare_outputs(outputs: np.ndarray, reference: np.ndarray) -> Fidelity:
    a = outputs.astype(np.float64).reshape(len(outputs), -1)
    b = reference.astype(np.float64).reshape(len(reference), -1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosine = np.where(norms > 0, np.sum(a * b, axis=1) / np.maximum(norms, 1e-300), 1.0)
    error = np.abs(a - b)
    agreement = float(np.mean(a.argmax(axis=1) == b.argmax(axis=1))) if a.shape[1] > 1 else None
    return Fidelity(float(cosine.mean()), float(error.max()), float(error.mean()), agreement)


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

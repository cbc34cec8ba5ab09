"""How closely a candidate's outputs follow a reference's, sample by sample: lean (numpy only), shared by the
host's quality gate (``edgeopt.evaluate``) and the device's golden check (``edgeopt.device.golden``)."""

from __future__ import annotations

import numpy as np


def finite_pairs(outputs: np.ndarray,
                 reference: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``outputs`` and ``reference`` as float64 samples x values; the positions compared (``kept``: where the
    reference is finite; the others 0 in both: the original's own inf or NaN, a log of an exact zero, is not the
    candidate's error); and the mask of the samples whose output is not finite where the reference is (``broken``,
    their rows 0 too): an INT8 log-mel that rounds a power to 0 gives -inf where FP32 is finite. Returns ``(a, b,
    broken, kept)``."""
    a = outputs.astype(np.float64).reshape(len(outputs), -1)
    b = reference.astype(np.float64).reshape(len(reference), -1)
    kept = np.isfinite(b)
    if kept.all() and np.isfinite(a).all():
        return a, b, np.zeros(len(a), dtype=bool), kept
    a, b = np.where(kept, a, 0.0), np.where(kept, b, 0.0)
    broken = ~np.isfinite(a).all(axis=1)
    return np.where(broken[:, None], 0.0, a), b, broken, kept


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` to ``b``'s (finite samples x values; 1 where both are zero)."""
    norm_a, norm_b = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    norms = norm_a * norm_b
    both_zero = (norm_a == 0) & (norm_b == 0)
    return np.where(norms > 0, np.sum(a * b, axis=1) / np.maximum(norms, 1e-300), np.where(both_zero, 1.0, 0.0))


def sample_cosines(outputs: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Cosine similarity of each sample's output to the reference's (samples x ...; 1 where both are zero); a
    sample whose output is not finite where the reference is scores 0 (:func:`finite_pairs`)."""
    a, b, broken, _ = finite_pairs(outputs, reference)
    return np.where(broken, 0.0, row_cosines(a, b))

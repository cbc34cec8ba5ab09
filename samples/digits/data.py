"""The digits data set that scikit-learn ships (1,797 8x8 images), split reproducibly.

Nothing is downloaded: ``sklearn.datasets.load_digits`` reads a file inside the scikit-learn package.
"""

from __future__ import annotations

import numpy as np

SEED = 0
EVAL_COUNT = 600
CALIB_COUNT = 300


def splits(size: int = 8) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (x, y), "calib": (x, y), "eval": (x, y)}`` with x as float32 N×1×size×size in [0, 1].

    ``calib`` is drawn from the training split (as calibration data is in practice); ``eval`` is held out.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    if size != 8:
        import torch
        import torch.nn.functional as F

        images = F.interpolate(torch.from_numpy(images), size=(size, size), mode="bilinear",
                               align_corners=False).numpy()
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(labels))
    eval_idx, train_idx = order[:EVAL_COUNT], order[EVAL_COUNT:]
    calib_idx = train_idx[:CALIB_COUNT]
    return {
        "train": (images[train_idx], labels[train_idx]),
        "calib": (images[calib_idx], labels[calib_idx]),
        "eval": (images[eval_idx], labels[eval_idx]),
    }

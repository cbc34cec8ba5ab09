"""Task metrics for the tiny detector (docs/metrics.md): F1 of the detected boxes against the true ones.

numpy only, so the same file can run inside a device bundle (``edgeopt golden create ... --metric``).
"""

from __future__ import annotations

import numpy as np

from edgeopt import metric

SCORE_THRESHOLD = 0.5
IOU_THRESHOLD = 0.5


def detections(sample: dict) -> np.ndarray:
    """The boxes (``x1, y1, x2, y2``) of one sample's outputs whose score passes the threshold."""
    boxes, scores = sample["boxes"].reshape(-1, 4), sample["scores"].reshape(-1)
    return boxes[scores >= SCORE_THRESHOLD]


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise intersection over union of ``a`` (n x 4) and ``b`` (m x 4)."""
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda r: (r[:, 2] - r[:, 0]) * (r[:, 3] - r[:, 1])  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return inter / np.maximum(union, 1e-9)


def matches(found: np.ndarray, truth: np.ndarray) -> tuple[int, list[float]]:
    """Greedy one-to-one matching at IoU >= 0.5: true positives and their IoUs."""
    if len(found) == 0 or len(truth) == 0:
        return 0, []
    overlaps = iou(found, truth)
    ious = []
    while overlaps.size and overlaps.max() >= IOU_THRESHOLD:
        i, j = np.unravel_index(overlaps.argmax(), overlaps.shape)
        ious.append(float(overlaps[i, j]))
        overlaps[i, :], overlaps[:, j] = -1, -1
    return len(ious), ious


@metric(primary="f1", higher_is_better=True, max_drop=0.02)
def f1(outputs: list[dict], targets: list) -> dict:
    """Detection F1 at IoU 0.5 over the evaluation set, with precision, recall and the mean IoU of matches."""
    found = total_truth = hits = 0
    ious: list[float] = []
    for sample, truth in zip(outputs, targets):
        boxes = detections(sample)
        truth = np.asarray(truth, np.float32).reshape(-1, 4)
        tp, matched = matches(boxes, truth)
        found, total_truth, hits = found + len(boxes), total_truth + len(truth), hits + tp
        ious += matched
    precision = hits / found if found else 0.0
    recall = hits / total_truth if total_truth else 0.0
    f1_score = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"f1": f1_score, "precision": precision, "recall": recall,
            "mean_iou": float(np.mean(ious)) if ious else 0.0}

"""Knowledge-distillation fine-tuning of a PyTorch student against a frozen teacher.

Every output counts (those the quality gate looks at, all by default), summed: the labelled output (with labelled
data, the first classifier-shaped one, as the gate scores top-1) gets ``alpha * T² * KL(softmax(teacher/T) ‖
softmax(student/T)) + (1 - alpha) * cross-entropy``; every other floating-point output ``MSE(student, teacher)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.errors import BadInputError


@dataclass(frozen=True)
class DistillConfig:
    epochs: int = 10
    lr: float = 1e-3
    temperature: float = 4.0
    alpha: float = 0.7  # weight of the soft (teacher) loss; 1 - alpha weighs the task loss
    batch_size: int = 64
    seed: int = 0
    outputs: tuple[int, ...] = ()  # indices of the outputs distilled (the gated ones); empty: every output

    def __post_init__(self) -> None:
        if self.epochs < 0 or self.lr <= 0 or self.temperature <= 0 or self.batch_size < 1:
            raise BadInputError("distillation: epochs >= 0, lr > 0, temperature > 0 and batch_size >= 1 are required")
        if not 0.0 <= self.alpha <= 1.0:
            raise BadInputError(f"distillation: alpha must lie in [0, 1] (given {self.alpha})")


@dataclass(frozen=True)
class TrainingSet:
    """Samples stacked into tensors by input name (batch-1 samples concatenated on axis 0)."""

    inputs: tuple  # torch tensors, one per model input, N on axis 0
    labels: object  # torch int64 tensor of N, or None

    @classmethod
    def from_samples(cls, data: SampleSet, input_names: list[str]) -> "TrainingSet":
        import torch

        inputs = tuple(torch.from_numpy(np.concatenate([s[name] for s in data.samples])) for name in input_names)
        if any(len(t) != len(inputs[0]) for t in inputs):
            raise BadInputError(f"{data.source}: inputs hold different numbers of samples; cannot batch for training")
        labels = None if data.labels is None else torch.from_numpy(np.asarray(data.labels, dtype=np.int64))
        return cls(inputs, labels)

    def __len__(self) -> int:
        return len(self.inputs[0])


def selected_outputs(out, indices: tuple[int, ...] = ()) -> tuple:
    """The model's outputs (a tensor, or a tuple/list of them) at ``indices`` (every output when empty)."""
    outputs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return tuple(outputs[i] for i in indices) if indices else outputs


def distill_loss(student_out, teacher_out, labels, temperature: float, alpha: float):
    """Summed over the floating-point outputs (a tensor, or a tuple of them): KL on temperature-softened logits
    plus task loss for the labelled output (the first classifier-shaped one) when there are labels; MSE for every
    other output."""
    import torch.nn.functional as F

    floats = [(s, t) for s, t in zip(selected_outputs(student_out), selected_outputs(teacher_out))
              if s.is_floating_point()]
    labelled = None if labels is None else next((i for i, (s, _) in enumerate(floats)
                                                 if s.ndim == 2 and s.shape[1] > 1), None)
    total = 0.0
    for index, (student_out, teacher_out) in enumerate(floats):
        if index != labelled:
            total = total + F.mse_loss(student_out, teacher_out)
            continue
        soft = F.kl_div(F.log_softmax(student_out / temperature, dim=1),
                        F.log_softmax(teacher_out / temperature, dim=1),
                        reduction="batchmean", log_target=True) * temperature ** 2
        total = total + alpha * soft + (1.0 - alpha) * F.cross_entropy(student_out, labels)
    return total


def evaluate_loss(student, teacher, data: TrainingSet, config: DistillConfig) -> float:
    """Mean distillation loss over ``data`` with both models in eval mode."""
    import torch

    student.eval()
    total = 0.0
    with torch.no_grad():
        for batch in torch.arange(len(data)).split(256):
            feeds = tuple(t[batch] for t in data.inputs)
            labels = None if data.labels is None else data.labels[batch]
            loss = distill_loss(selected_outputs(student(*feeds), config.outputs),
                                selected_outputs(teacher(*feeds), config.outputs), labels, config.temperature,
                                config.alpha)
            total += float(loss) * len(batch)
    return total / len(data)


def fine_tune(student, teacher, data: TrainingSet, config: DistillConfig, *, label: str = "distill",
              quiet: bool = False, extra_loss: Callable | None = None,
              extra_groups: list[tuple[list, float]] = ()) -> list[float]:
    """Train ``student`` in place against ``teacher``; return the mean training loss of each epoch.

    ``extra_loss()`` (e.g. a sparsity regulariser) is added to every batch's loss; ``extra_groups`` trains some
    parameters (e.g. sparsity masks) at their own learning rate. Deterministic for a seed on the same thread count.
    """
    import torch

    from edgeopt.progress import progress_bar

    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    teacher.eval()
    grouped = {id(p) for params, _ in extra_groups for p in params}
    trainable = [p for p in student.parameters() if p.requires_grad and id(p) not in grouped]
    if not trainable:
        raise BadInputError(f"{label}: the model has no trainable parameters")
    optimizer = torch.optim.Adam([{"params": trainable}] + [{"params": params, "lr": lr} for params, lr in extra_groups],
                                 lr=config.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(config.epochs, 1))
    batches_per_epoch = -(-len(data) // config.batch_size)
    losses: list[float] = []
    with progress_bar(label, config.epochs * batches_per_epoch, quiet=quiet) as advance:
        for _ in range(config.epochs):
            student.train()
            total = 0.0
            for batch in torch.randperm(len(data), generator=generator).split(config.batch_size):
                feeds = tuple(t[batch] for t in data.inputs)
                labels = None if data.labels is None else data.labels[batch]
                with torch.no_grad():
                    teacher_outs = selected_outputs(teacher(*feeds), config.outputs)
                loss = distill_loss(selected_outputs(student(*feeds), config.outputs), teacher_outs, labels,
                                    config.temperature, config.alpha)
                if extra_loss is not None:
                    loss = loss + extra_loss()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * len(batch)
                advance()
            scheduler.step()
            losses.append(total / len(data))
    student.eval()
    return losses

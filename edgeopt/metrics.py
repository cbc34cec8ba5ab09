"""Counting what a model costs: parameters and multiply-accumulates of a PyTorch module (weight bytes of a
graph or saved model are in ``edgeopt.weight_bytes``)."""

from __future__ import annotations


def count_params_and_macs(module, example: tuple) -> tuple[int, int]:
    """Parameters and multiply-accumulates of one forward pass (torch-pruning's counter)."""
    import torch_pruning as tp

    macs, params = tp.utils.count_ops_and_params(module, example)
    return int(params), int(macs)

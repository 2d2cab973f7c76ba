"""A layer's projection: x @ W^T with W as it was loaded (16-bit, or block-FP8 with its scales), the method chosen
once at construction (common/quantization/methods.py)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lightllm_mtp.common.quantization.methods import StoredWeight, common_method


class Linear:
    """One projection, possibly several checkpoint tensors fused along their output rows ([q | k | v], [gate | up])."""

    def __init__(self, weight: StoredWeight, names: list[str]):
        self.method = common_method([weight], names)
        self.weight = weight
        self.names = names

    @classmethod
    def fused(cls, weights: Mapping[str, StoredWeight], names: list[str]) -> "Linear":
        """The tensors `names` of the loaded dict, rows concatenated in that order; they must share a format."""
        parts = [weights[n] for n in names]
        method = common_method(parts, names)
        return cls(method.cat_rows(parts, " + ".join(names)), names)

    @property
    def out_features(self) -> int:
        return self.weight.shape[-2]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.linear(x, self.weight)


def same_format(weights: Mapping[str, StoredWeight], names: list[str]) -> bool:
    """Whether the tensors can be fused into one projection."""
    try:
        common_method([weights[n] for n in names], names)
    except ValueError:
        return False
    return True

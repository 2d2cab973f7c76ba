from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch
from lightllm_mtp.common.layers.base import Layer, ModelCaches, Weights
from lightllm_mtp.common.quantization.linear import Linear
from lightllm_mtp.common.tensor_spec import TensorSpec, TpShard
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.activation.silu_and_mul import silu_and_mul


def mlp_specs(prefix: str, hidden: int, inter: int) -> list[TensorSpec]:
    return [
        TensorSpec(f"{prefix}gate_proj.weight", (inter, hidden), tp=TpShard(0), quantizable=True),  # column-parallel
        TensorSpec(f"{prefix}up_proj.weight", (inter, hidden), tp=TpShard(0), quantizable=True),
        TensorSpec(f"{prefix}down_proj.weight", (hidden, inter), tp=TpShard(1), quantizable=True),  # row-parallel
    ]


class GatedMLP:
    """down(silu(gate(x)) * up(x)) with gate and up fused into one [2I, H] matrix."""

    def __init__(self, prefix: str, weights: Weights):
        self.gate_up = Linear.fused(weights, [f"{prefix}gate_proj.weight", f"{prefix}up_proj.weight"])
        self.down = Linear(weights[f"{prefix}down_proj.weight"], [f"{prefix}down_proj.weight"])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(silu_and_mul(self.gate_up(x)))


class DenseMLP(Layer):
    def __init__(self, cfg: ModelConfig, prefix: str, weights: Weights):
        self.mlp = GatedMLP(prefix, weights)

    @classmethod
    def specs(cls, cfg: ModelConfig, prefix: str) -> list[TensorSpec]:
        assert cfg.intermediate_size is not None
        return mlp_specs(prefix, cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        return self.mlp(x)

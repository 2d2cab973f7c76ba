from __future__ import annotations

import torch

from lightllm_mtp.common.layers.base import Weights
from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.norm.rmsnorm import rmsnorm


class RMSNorm:
    """Zero-centered (1 + w) RMSNorm over the hidden size."""

    def __init__(self, cfg: ModelConfig, name: str, weights: Weights):
        self.weight = weights[name]
        self.eps = cfg.rms_norm_eps

    @staticmethod
    def specs(cfg: ModelConfig, name: str) -> list[TensorSpec]:
        return [TensorSpec(name, (cfg.hidden_size,))]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm(x, self.weight, self.eps)

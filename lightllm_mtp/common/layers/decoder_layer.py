from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch
from lightllm_mtp.common.layers.base import Layer, ModelCaches, Weights
from lightllm_mtp.common.layers.norm import RMSNorm
from lightllm_mtp.common.weight_loader import TensorSpec
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.rmsnorm import add_rmsnorm


class DecoderLayer:
    """Pre-norm block: h = x + mixer(norm_in(x)); y = h + ffn(norm_post(h))."""

    def __init__(self, cfg: ModelConfig, prefix: str, weights: Weights, mixer: Layer, ffn: Layer):
        self.input_norm = RMSNorm(cfg, f"{prefix}input_layernorm.weight", weights)
        self.post_norm = RMSNorm(cfg, f"{prefix}post_attention_layernorm.weight", weights)
        self.mixer = mixer
        self.ffn = ffn

    @staticmethod
    def norm_specs(cfg: ModelConfig, prefix: str) -> list[TensorSpec]:
        return RMSNorm.specs(cfg, f"{prefix}input_layernorm.weight") + RMSNorm.specs(
            cfg, f"{prefix}post_attention_layernorm.weight"
        )

    def forward(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        mixed = self.mixer.forward(self.input_norm(x), batch, caches)
        normed, h = add_rmsnorm(mixed, x, self.post_norm.weight, self.post_norm.eps)  # h = x + mixed
        return h + self.ffn.forward(normed, batch, caches)

from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch
from lightllm_mtp.common.layers.base import Layer, ModelCaches, Weights
from lightllm_mtp.common.layers.norm import RMSNorm
from lightllm_mtp.common.parallel_state import tp_all_reduce
from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.norm.rmsnorm import add_rmsnorm


class DecoderLayer:
    """Pre-norm block: h = x + mixer(norm_in(x)); y = h + ffn(norm_post(h)).

    The residual stream is carried, not materialised: forward(delta, residual) takes the previous block's
    output delta (x = residual + delta, None for the first block) and returns (ffn out, h), so each residual add
    is fused into the next RMSNorm (norm_in here, or the model's final norm)."""

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

    def forward(
        self, delta: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch, caches: ModelCaches
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            x, normed = delta, self.input_norm(delta)
        else:
            normed, x = add_rmsnorm(delta, residual, self.input_norm.weight, self.input_norm.eps)  # x = residual + delta
        mixed = tp_all_reduce(self.mixer.forward(normed, batch, caches))  # row-parallel outputs: partial sums
        normed, h = add_rmsnorm(mixed, x, self.post_norm.weight, self.post_norm.eps)  # h = x + mixed
        return tp_all_reduce(self.ffn.forward(normed, batch, caches)), h

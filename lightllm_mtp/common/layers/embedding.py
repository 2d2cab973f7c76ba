from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.common.layers.base import Weights
from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.config.model_config import ModelConfig


class VocabEmbedding:
    def __init__(self, name: str, weights: Weights):
        self.weight = weights[name]  # [V, H]

    @staticmethod
    def specs(cfg: ModelConfig, name: str) -> list[TensorSpec]:
        return [TensorSpec(name, (cfg.vocab_size, cfg.hidden_size))]

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead:
    """Projects final-norm hidden states to fp32 logits; shares the embedding matrix when tied."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight  # [V, H]

    @staticmethod
    def specs(cfg: ModelConfig) -> list[TensorSpec]:
        return [] if cfg.tie_word_embeddings else [TensorSpec("lm_head.weight", (cfg.vocab_size, cfg.hidden_size))]

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight).float()

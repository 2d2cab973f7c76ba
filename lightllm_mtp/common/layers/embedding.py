"""Vocab-parallel embedding and lm_head: tp rank r holds vocabulary rows [r * part, (r + 1) * part) (part =
ceil(V / tp), the last rank's tail zero-padded); lookups are all-reduced, logits all-gathered."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.common.layers.base import Weights
from lightllm_mtp.common.parallel_state import state, tp_all_gather_last, tp_all_reduce
from lightllm_mtp.common.tensor_spec import TensorSpec, TpShard
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.linear.gemv import linear

_VOCAB_ROWS = TpShard(0, pad=True)


class VocabEmbedding:
    def __init__(self, name: str, weights: Weights):
        self.weight = weights[name]  # [V, H], under tp this rank's [part, H]

    @staticmethod
    def specs(cfg: ModelConfig, name: str) -> list[TensorSpec]:
        return [TensorSpec(name, (cfg.vocab_size, cfg.hidden_size), tp=_VOCAB_ROWS)]

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        tp = state()
        if tp.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        part = self.weight.shape[0]
        local = input_ids - tp.tp_rank * part
        inside = (local >= 0) & (local < part)
        out = F.embedding(local.clamp(0, part - 1), self.weight) * inside[:, None].to(self.weight.dtype)
        return tp_all_reduce(out)


def with_input_embeds(embedded: torch.Tensor, input_embeds: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """The token embeddings with the rows of `input_embeds` (rows [n], vectors [n, H]: an image's vision embeddings)
    in place of their tokens'."""
    if input_embeds is None:
        return embedded
    rows, vectors = input_embeds
    return embedded.index_copy(0, rows, vectors.to(embedded.dtype))


class LMHead:
    """Projects final-norm hidden states to fp32 logits; shares the embedding matrix when tied."""

    def __init__(self, weight: torch.Tensor, vocab_size: int | None = None, vocab_parallel: bool = True):
        """vocab_parallel False: `weight` is whole on every rank (a reduced draft vocabulary's rows)."""
        self.weight = weight  # [V, H], under tp this rank's [part, H]
        self.vocab_size = vocab_size if vocab_size is not None else weight.shape[0]
        self.vocab_parallel = vocab_parallel

    @staticmethod
    def specs(cfg: ModelConfig) -> list[TensorSpec]:
        if cfg.tie_word_embeddings:
            return []
        return [TensorSpec("lm_head.weight", (cfg.vocab_size, cfg.hidden_size), tp=_VOCAB_ROWS)]

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = linear(hidden, self.weight).float()
        if state().tp_size == 1 or not self.vocab_parallel:
            return logits
        return tp_all_gather_last(logits)[:, : self.vocab_size]

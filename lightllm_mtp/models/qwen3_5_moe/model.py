from __future__ import annotations

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.layers.moe import SparseMoE


class Qwen3_5MoeModel(TpPartBaseModel):
    """Qwen3.5 MoE: every layer's feed-forward is routed experts plus a gated shared expert."""

    ffn_class = SparseMoE

from __future__ import annotations

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.layers.mlp import DenseMLP


class Qwen3_5Model(TpPartBaseModel):
    """Qwen3.5 dense: every layer's feed-forward is a gated SiLU MLP."""

    ffn_class = DenseMLP

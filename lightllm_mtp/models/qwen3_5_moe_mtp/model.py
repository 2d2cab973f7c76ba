from __future__ import annotations

from lightllm_mtp.common.layers.moe import SparseMoE
from lightllm_mtp.models.mtp_retarget import MtpWeightRetargetMixin


class Qwen3_5MoeMTPModel(MtpWeightRetargetMixin):
    """Qwen3.5 MoE MTP head: one gated-attention layer with routed + shared experts."""

    ffn_class = SparseMoE

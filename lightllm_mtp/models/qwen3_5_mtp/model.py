from __future__ import annotations

from lightllm_mtp.common.layers.mlp import DenseMLP
from lightllm_mtp.models.mtp_retarget import MtpWeightRetargetMixin


class Qwen3_5MTPModel(MtpWeightRetargetMixin):
    """Qwen3.5 dense MTP head: one gated-attention layer with a dense MLP."""

    ffn_class = DenseMLP

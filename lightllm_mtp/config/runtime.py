"""The runtime record fixed before a model is built: dtype, device, sizes, and where the weights come from."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from lightllm_mtp.config.parallel_config import RankInfo, ParallelConfig
from lightllm_mtp.config.quant_config import QuantConfig


class LoadFormat(Enum):
    AUTO = "auto"  # safetensors shards of the model directory
    DUMMY = "dummy"  # random tensors of the declared shapes, made on the device (benchmarks at real shapes)

@dataclass(frozen=True)
class RuntimeShape:
    """Sizes the engine fixes before the model is built."""

    dtype: torch.dtype
    device: torch.device
    max_reqs: int  # concurrent request slots
    max_model_len: int  # prompt + generated tokens per request
    kv_pool_size: int  # token slots in the KV pool
    num_draft_tokens: int = 0  # MTP draft tokens per step: widens the conv slot, adds per-position SSM rows
    draft_kv_layers: int = 0  # extra KV pool layers owned by MTP draft modules
    load_format: LoadFormat = LoadFormat.AUTO
    rank: RankInfo = RankInfo(ParallelConfig())  # this process's tensor / pipeline rank (tp=pp=1: the only one)
    online_quant: QuantConfig | None = None  # quantize the 16 / 32-bit projections at load (option quantization fp8)
    kv_dtype: torch.dtype | None = None  # the KV pool's layers of this model (None: dtype; float8_e4m3fn: FP8 KV)
    draft_kv_dtype: torch.dtype | None = None  # the MTP draft modules' layers of the pool (None: dtype)

    @property
    def kv_pool_dtype(self) -> torch.dtype:
        return self.kv_dtype or self.dtype

    @property
    def draft_kv_pool_dtype(self) -> torch.dtype:
        return self.draft_kv_dtype or self.dtype

"""Layer contract: a layer declares its checkpoint tensors (`specs`) and picks them out of the loaded dict."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch
from lightllm_mtp.common.kv_pool import KvPool
from lightllm_mtp.common.req_manager import ReqManager
from lightllm_mtp.common.state_snapshots import StateSnapshotPool
from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.config.model_config import ModelConfig

Weights = Mapping[str, torch.Tensor]  # checkpoint name -> loaded tensor


@dataclass
class ModelCaches:
    """What a layer's forward reads and writes besides its weights."""

    kv_pool: KvPool
    req_manager: ReqManager
    rope_cos: torch.Tensor  # [max_positions, rotary_dim/2] fp32
    rope_sin: torch.Tensor  # [max_positions, rotary_dim/2] fp32
    snapshots: StateSnapshotPool | None = None  # prefix cache: GDN state snapshots
    # models with a vision tower (common/layers/rope_positions.py): each request slot's rope delta [slots] int64, and
    # the M-RoPE axis of each rotary frequency [rotary_dim/2] int64
    rope_delta: torch.Tensor | None = None
    mrope_axis: torch.Tensor | None = None


class Layer(ABC):
    @classmethod
    @abstractmethod
    def specs(cls, cfg: ModelConfig, prefix: str) -> list[TensorSpec]:
        """Checkpoint tensors this layer needs, by full name."""

    @abstractmethod
    def forward(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""

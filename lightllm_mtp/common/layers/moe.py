from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch
from lightllm_mtp.common.layers.base import Layer, ModelCaches, Weights
from lightllm_mtp.common.layers.mlp import GatedMLP, mlp_specs
from lightllm_mtp.common.tensor_spec import TensorSpec, TpShard
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.moe.fused_moe import fused_moe
from lightllm_mtp.kernels.moe.moe_routing import select_experts


class SparseMoE(Layer):
    """Softmax top-k routed experts (renormalised) plus a shared expert behind a sigmoid scalar gate."""

    def __init__(self, cfg: ModelConfig, prefix: str, weights: Weights):
        assert cfg.moe is not None
        self.top_k = cfg.moe.num_experts_per_tok
        self.router = weights[f"{prefix}gate.weight"]  # [E, H]
        self.w_gate_up = weights[f"{prefix}experts.gate_up_proj"]  # [E, 2I, H], rows [gate; up]
        self.w_down = weights[f"{prefix}experts.down_proj"]  # [E, H, I]
        self.shared = GatedMLP(f"{prefix}shared_expert.", weights)
        self.shared_gate = weights[f"{prefix}shared_expert_gate.weight"]  # [1, H]

    @classmethod
    def specs(cls, cfg: ModelConfig, prefix: str) -> list[TensorSpec]:
        moe = cfg.moe
        assert moe is not None
        e, h, i = moe.num_experts, cfg.hidden_size, moe.moe_intermediate_size
        per_expert_gate_up = tuple(
            (f"{prefix}experts.{j}.gate_proj.weight", f"{prefix}experts.{j}.up_proj.weight") for j in range(e)
        )
        per_expert_down = tuple((f"{prefix}experts.{j}.down_proj.weight",) for j in range(e))
        return [
            TensorSpec(f"{prefix}gate.weight", (e, h)),
            TensorSpec(f"{prefix}experts.gate_up_proj", (e, 2 * i, h), stacked_from=per_expert_gate_up,
                       tp=TpShard(1, sections=(i, i))),  # every expert split column / row-parallel
            TensorSpec(f"{prefix}experts.down_proj", (e, h, i), stacked_from=per_expert_down, tp=TpShard(2)),
            *mlp_specs(f"{prefix}shared_expert.", h, moe.shared_expert_intermediate_size),
            TensorSpec(f"{prefix}shared_expert_gate.weight", (1, h)),
        ]

    def forward(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        topk_weights, topk_ids = select_experts(F.linear(x, self.router), self.top_k)
        routed = fused_moe(x, self.w_gate_up, self.w_down, topk_weights, topk_ids)
        shared = torch.sigmoid(F.linear(x, self.shared_gate)) * self.shared(x)
        return routed + shared

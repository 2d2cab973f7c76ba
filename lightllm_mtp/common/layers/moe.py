from __future__ import annotations

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch
from lightllm_mtp.common.layers.base import Layer, ModelCaches, Weights
from lightllm_mtp.common.layers.mlp import GatedMLP, mlp_specs
from lightllm_mtp.common.quantization.methods import common_method
from lightllm_mtp.common.tensor_spec import TensorSpec, TpShard
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.kernels.linear.gemv import linear
from lightllm_mtp.kernels.moe.fused_moe import fused_moe_shared_fits
from lightllm_mtp.kernels.moe.moe_expert_pass import DECODE_TILES
from lightllm_mtp.kernels.moe.moe_route_align import route_align
from lightllm_mtp.kernels.moe.moe_routing import select_experts, stack_router


class SparseMoE(Layer):
    """Softmax top-k routed experts (renormalised) plus a shared expert behind a sigmoid scalar gate.

    One projection gives the router logits and the shared gate logit (rows stacked at load; a few-row GEMV at T <=
    4 on CUDA). Decode / verify sizes on CUDA: routing + expert alignment (one kernel for small steps), then one
    expert-major pass over the routed experts and the shared expert (slot k): gate_up, down, slot sum; 5 launches
    per layer at T * (k+1) <= 64.
    Prefill sizes and CPU: top-k routing, the grouped-GEMM (or reference) routed experts, the shared MLP."""

    def __init__(self, cfg: ModelConfig, prefix: str, weights: Weights):
        assert cfg.moe is not None
        self.top_k = cfg.moe.num_experts_per_tok
        self.num_experts = cfg.moe.num_experts
        # [E + 1 + pad, H]: rows [router; shared_expert_gate; zeros]
        router, shared_gate = weights[f"{prefix}gate.weight"], weights[f"{prefix}shared_expert_gate.weight"]
        self.router_and_gate = stack_router(router, shared_gate)
        names = [f"{prefix}experts.gate_up_proj", f"{prefix}experts.down_proj"]
        w_gate_up, w_down = weights[names[0]], weights[names[1]]  # [E, 2I, H] rows [gate; up], [E, H, I]
        self.experts = common_method([w_gate_up, w_down], names)  # how the experts are stored and multiplied
        self.shared = GatedMLP(f"{prefix}shared_expert.", weights)
        # the one-pass kernel takes the shared expert as expert E when it is stored like the routed ones
        self.shared_in_pass = self.shared.gate_up.method.name == self.shared.down.method.name == self.experts.name
        shared_gate_up, shared_down = self.shared.gate_up.weight, self.shared.down.weight
        if self.shared_in_pass:
            w_gate_up, w_down, shared_gate_up, shared_down = self.experts.prepare_experts(
                w_gate_up, w_down, shared_gate_up, shared_down)
        self.w_gate_up, self.w_down = w_gate_up, w_down
        self.shared_weights = (shared_gate_up, shared_down)

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
                       tp=TpShard(1, sections=(i, i)), quantizable=True),  # every expert split column / row-parallel
            TensorSpec(f"{prefix}experts.down_proj", (e, h, i), stacked_from=per_expert_down, tp=TpShard(2),
                       quantizable=True),
            *mlp_specs(f"{prefix}shared_expert.", h, moe.shared_expert_intermediate_size),
            TensorSpec(f"{prefix}shared_expert_gate.weight", (1, h)),
        ]

    def forward(self, x: torch.Tensor, batch: ForwardBatch, caches: ModelCaches) -> torch.Tensor:
        if batch is not None and batch.padded:  # a prefill graph's padding rows: garbage (NaN) must not pick experts
            x = torch.where(batch.real_rows(), x, 0.0)
        logits = linear(x, self.router_and_gate)  # [T, E + 1 + pad]
        e = self.num_experts
        if self.shared_in_pass and fused_moe_shared_fits(x, self.top_k):
            r = route_align(logits, num_experts=e, top_k=self.top_k, shared_gate=True, block_m=DECODE_TILES.block_m)
            return self.experts.moe_shared(x, self.w_gate_up, self.w_down, *self.shared_weights, r.weights, r.ids,
                                           alignment=(r.sorted_pairs, r.block_expert))  # fmt: skip
        topk_weights, topk_ids = select_experts(logits[:, :e], self.top_k)
        routed = self.experts.moe(x, self.w_gate_up, self.w_down, topk_weights, topk_ids)
        shared = torch.sigmoid(logits[:, e : e + 1]) * self.shared(x)
        return routed + shared

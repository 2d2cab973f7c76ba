"""MoE router: softmax top-k with renormalised weights (HF Qwen3_5MoeTopKRouter)."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_float, check_shape

_OP = "select_experts"


def select_experts_ref(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def select_experts(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (topk_weights [T, k] in router_logits.dtype, topk_ids [T, k] int64).

    fp32 softmax over the E experts, top-k (descending), the k weights renormalised to sum 1, then cast."""
    check_shape(_OP, "router_logits", router_logits, (None, None), "[T, E]")
    check_float(_OP, "router_logits", router_logits)
    if not 1 <= top_k <= router_logits.shape[1]:
        raise ValueError(f"{_OP}: top_k must be in [1, E={router_logits.shape[1]}], got {top_k}")
    return select_experts_ref(router_logits, top_k)

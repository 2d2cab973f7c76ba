"""Routed-expert SwiGLU MLPs weighted by the router (the shared expert is not included)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_float, check_index, check_same_dtype, check_shape

_OP = "fused_moe"


def fused_moe_ref(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    out = torch.zeros_like(x)
    inter = w_down.shape[2]
    ids_t = topk_ids.t()  # [k, T]: per expert, rows come ordered by (k slot, token) as in HF
    for e in torch.unique(topk_ids).tolist():
        slot, token = torch.nonzero(ids_t == e, as_tuple=True)
        gate_up = F.linear(x[token], w_gate_up[e])
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = F.linear(h, w_down[e]) * topk_weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def fused_moe(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """x [T, H]; w_gate_up [E, 2I, H] (gate = rows [0, I), up = rows [I, 2I)); w_down [E, H, I];
    topk_weights [T, k]; topk_ids [T, k] int64 (int32 accepted), distinct per token
    -> [T, H] in x.dtype = sum_k w_k * down_e(silu(gate_e x) * up_e x), accumulated in x.dtype."""
    check_shape(_OP, "x", x, (None, None), "[T, H]")
    check_float(_OP, "x", x)
    check_shape(_OP, "w_gate_up", w_gate_up, (None, None, x.shape[1]), "[E, 2I, H]")
    if w_gate_up.shape[1] % 2:
        raise ValueError(f"{_OP}: w_gate_up must be [E, 2I, H] with an even dim 1, got {list(w_gate_up.shape)}")
    e, inter = w_gate_up.shape[0], w_gate_up.shape[1] // 2
    check_shape(_OP, "w_down", w_down, (e, x.shape[1], inter), "[E, H, I]")
    check_same_dtype(_OP, "x", x, w_gate_up=w_gate_up, w_down=w_down)
    check_shape(_OP, "topk_ids", topk_ids, (x.shape[0], None), "[T, k]")
    check_index(_OP, "topk_ids", topk_ids)
    check_shape(_OP, "topk_weights", topk_weights, tuple(topk_ids.shape), "[T, k]")
    check_float(_OP, "topk_weights", topk_weights)
    check_device(_OP, x=x, w_gate_up=w_gate_up, w_down=w_down, topk_weights=topk_weights, topk_ids=topk_ids)
    return fused_moe_ref(x, w_gate_up, w_down, topk_weights, topk_ids)

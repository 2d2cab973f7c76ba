"""Routed-expert SwiGLU MLPs weighted by the router; `fused_moe_shared` adds the gated shared expert as one more
expert of the same pass. Small T (decode, verify): the expert-major Triton pass (moe_expert_pass); large T
(prefill): torch._grouped_mm over the expert-sorted rows (moe_permute)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_float, check_index, check_same_dtype, check_shape
from lightllm_mtp.kernels.activation.silu_and_mul import silu_and_mul
from lightllm_mtp.kernels.moe.moe_expert_pass import expert_pass_ref, expert_pass_triton
from lightllm_mtp.kernels.moe.moe_permute import moe_permute, moe_unpermute, sort_by_expert
from lightllm_mtp.kernels.triton_utils import use_triton

_OP = "fused_moe"
_SHARED_OP = "fused_moe_shared"
# Up to this many routed (token, expert) rows the expert-major Triton pass runs (each expert's weights read once
# per 16-row tile, no host sync: CUDA-graph safe); above, the grouped GEMM (prefill sizes).
EXPERT_PASS_MAX_ROWS = 1024


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
    -> [T, H] in x.dtype = sum_k w_k * down_e(silu(gate_e x) * up_e x), accumulated in fp32 on CUDA (in x.dtype
    by the reference). On CUDA the weights must have unit stride along their last dim."""
    _check_moe_args(_OP, x, w_gate_up, w_down, topk_weights, topk_ids)
    grouped = x.is_cuda and x.dtype == torch.bfloat16 and _grouped_mm_fits(x, w_gate_up, w_down)
    # the expert pass also takes the large steps the grouped GEMM cannot (fp32 on CUDA): no host sync, so a prefill
    # CUDA graph can hold it (the reference's torch.unique reads the device)
    if use_triton(x) and (topk_ids.numel() <= EXPERT_PASS_MAX_ROWS or not grouped):
        _check_unit_stride(_OP, w_gate_up=w_gate_up, w_down=w_down)
        return expert_pass_triton(_rows_unit_stride(x), w_gate_up, w_down, topk_weights, topk_ids)
    if grouped:
        return fused_moe_grouped(x, w_gate_up, w_down, topk_weights, topk_ids)
    return fused_moe_ref(x, w_gate_up, w_down, topk_weights, topk_ids)


def fused_moe_shared(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    shared_gate_up: torch.Tensor,
    shared_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    alignment: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Routed experts plus the shared expert in one expert-major pass (small T). shared_gate_up [2I_s, H] (rows
    [gate; up]), shared_down [H, I_s]; topk_weights / topk_ids [T, k+1] from route_topk(shared_gate=True): slots
    0..k-1 routed (ids < E), slot k the shared expert (id E, weight its sigmoid gate); the ids are device data and
    not checked. Falls back to the reference (fp32 math) off CUDA; callers use `fused_moe_shared_fits` to choose
    this path. `alignment`: route_align's (sorted_pairs, block_expert) for these ids at DECODE_TILES.block_m, which
    saves the pass its own moe_align launch (device data, not checked)."""
    _check_moe_args(_SHARED_OP, x, w_gate_up, w_down, topk_weights, topk_ids)
    check_shape(_SHARED_OP, "shared_gate_up", shared_gate_up, (None, x.shape[1]), "[2I_s, H]")
    if shared_gate_up.shape[0] % 2:
        raise ValueError(f"{_SHARED_OP}: shared_gate_up must be [2I_s, H] with an even dim 0, got "
                         f"{list(shared_gate_up.shape)}")  # fmt: skip
    check_shape(_SHARED_OP, "shared_down", shared_down, (x.shape[1], shared_gate_up.shape[0] // 2), "[H, I_s]")
    check_same_dtype(_SHARED_OP, "x", x, shared_gate_up=shared_gate_up, shared_down=shared_down)
    check_device(_SHARED_OP, x=x, shared_gate_up=shared_gate_up, shared_down=shared_down)
    if topk_ids.shape[1] < 2:
        raise ValueError(f"{_SHARED_OP}: topk_ids must hold k routed slots and the shared slot, got "
                         f"{list(topk_ids.shape)}")  # fmt: skip
    if use_triton(x):
        _check_unit_stride(_SHARED_OP, w_gate_up=w_gate_up, w_down=w_down, shared_gate_up=shared_gate_up,
                           shared_down=shared_down)  # fmt: skip
        return expert_pass_triton(_rows_unit_stride(x), w_gate_up, w_down, topk_weights, topk_ids, shared_gate_up,
                                  shared_down, alignment=alignment)  # fmt: skip
    return expert_pass_ref(x, w_gate_up, w_down, topk_weights, topk_ids, shared_gate_up, shared_down)


def fused_moe_shared_fits(x: torch.Tensor, top_k: int) -> bool:
    """Whether fused_moe_shared runs the Triton pass for x (CUDA, decode / verify sizes)."""
    return use_triton(x) and x.shape[0] * top_k <= EXPERT_PASS_MAX_ROWS


def _check_moe_args(op, x, w_gate_up, w_down, topk_weights, topk_ids) -> None:
    check_shape(op, "x", x, (None, None), "[T, H]")
    check_float(op, "x", x)
    check_shape(op, "w_gate_up", w_gate_up, (None, None, x.shape[1]), "[E, 2I, H]")
    if w_gate_up.shape[1] % 2:
        raise ValueError(f"{op}: w_gate_up must be [E, 2I, H] with an even dim 1, got {list(w_gate_up.shape)}")
    e, inter = w_gate_up.shape[0], w_gate_up.shape[1] // 2
    check_shape(op, "w_down", w_down, (e, x.shape[1], inter), "[E, H, I]")
    check_same_dtype(op, "x", x, w_gate_up=w_gate_up, w_down=w_down)
    check_shape(op, "topk_ids", topk_ids, (x.shape[0], None), "[T, k]")
    check_index(op, "topk_ids", topk_ids)
    check_shape(op, "topk_weights", topk_weights, tuple(topk_ids.shape), "[T, k]")
    check_float(op, "topk_weights", topk_weights)
    check_device(op, x=x, w_gate_up=w_gate_up, w_down=w_down, topk_weights=topk_weights, topk_ids=topk_ids)


def _rows_unit_stride(t: torch.Tensor) -> torch.Tensor:
    # the Triton pass indexes x by its row stride with unit stride along the last dim
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_unit_stride(op: str, **weights: torch.Tensor) -> None:
    # a weight is never copied per call (that would re-read and write it every step)
    for name, w in weights.items():
        if w.stride(-1) != 1:
            raise ValueError(f"{op}: {name} must have unit stride along its last dim, got strides {list(w.stride())}")


def _grouped_mm_fits(x, w_gate_up, w_down) -> bool:
    # torch._grouped_mm (CUTLASS grouped GEMM on sm90) wants 16-byte aligned rows: dims that are multiples of 8
    dims = (x.shape[1], w_gate_up.shape[1], w_down.shape[2])
    return hasattr(torch, "_grouped_mm") and all(d % 8 == 0 for d in dims)


def fused_moe_grouped(x, w_gate_up, w_down, topk_weights, topk_ids) -> torch.Tensor:
    """Prefill path: (token, slot) rows sorted by expert and gathered into that order (moe_permute), two grouped
    GEMMs over the experts' weights (each read once), then each token's k rows weighted and summed in fp32
    (moe_unpermute: a gather, no scatter or atomics). No host sync."""
    top_k = topk_ids.shape[1]
    order, group_ends = sort_by_expert(topk_ids, num_experts=w_gate_up.shape[0])
    rows, pos = moe_permute(x, order, top_k=top_k)
    gate_up = torch._grouped_mm(rows, w_gate_up.transpose(1, 2), offs=group_ends)
    down = torch._grouped_mm(silu_and_mul(gate_up), w_down.transpose(1, 2), offs=group_ends)
    return moe_unpermute(down, pos, topk_weights)

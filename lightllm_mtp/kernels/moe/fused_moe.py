"""Routed-expert SwiGLU MLPs weighted by the router (the shared expert is not included)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_float, check_index, check_same_dtype, check_shape
from lightllm_mtp.kernels.activation.silu_and_mul import silu_and_mul
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

_OP = "fused_moe"
# Up to this many (token, expert) rows the Triton path runs one GEMV per row: each selected expert's weights are
# read once per row, which is the whole cost at decode batch sizes and needs no host sync (CUDA-graph safe).
_GEMV_MAX_ROWS = 1024


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
    if use_triton(x) and topk_ids.numel() <= _GEMV_MAX_ROWS:
        return fused_moe_gemv(x, w_gate_up, w_down, topk_weights, topk_ids)
    if x.is_cuda and x.dtype == torch.bfloat16 and _grouped_mm_fits(x, w_gate_up, w_down):
        return fused_moe_grouped(x, w_gate_up, w_down, topk_weights, topk_ids)
    return fused_moe_ref(x, w_gate_up, w_down, topk_weights, topk_ids)


def _grouped_mm_fits(x, w_gate_up, w_down) -> bool:
    # torch._grouped_mm (CUTLASS grouped GEMM on sm90) wants 16-byte aligned rows: dims that are multiples of 8
    dims = (x.shape[1], w_gate_up.shape[1], w_down.shape[2])
    return hasattr(torch, "_grouped_mm") and all(d % 8 == 0 for d in dims)


def fused_moe_grouped(x, w_gate_up, w_down, topk_weights, topk_ids) -> torch.Tensor:
    """Prefill path: (token, expert) rows sorted by expert, two grouped GEMMs over the experts' weights (each
    read once), weighted scatter-add back to the tokens in fp32. No host sync."""
    t, top_k = topk_ids.shape
    experts = w_gate_up.shape[0]
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    token = order // top_k
    counts = torch.zeros(experts, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)  # end row of each expert's group
    gate_up = torch._grouped_mm(x[token], w_gate_up.transpose(1, 2), offs=offs)
    down = torch._grouped_mm(silu_and_mul(gate_up), w_down.transpose(1, 2), offs=offs)
    weighted = down.float() * topk_weights.reshape(-1)[order].float()[:, None]
    out = torch.zeros(t, x.shape[1], dtype=torch.float32, device=x.device).index_add_(0, token, weighted)
    return out.to(x.dtype)


def fused_moe_gemv(x, w_gate_up, w_down, topk_weights, topk_ids) -> torch.Tensor:
    """Triton path: per (token, expert) row GEMVs through the expert id, no weight copies, no host sync."""
    t, top_k = topk_ids.shape
    inter, hidden = w_down.shape[2], x.shape[1]
    ids = topk_ids.reshape(-1).to(torch.int32)
    gate_up = torch.empty(t * top_k, 2 * inter, dtype=x.dtype, device=x.device)
    _launch_gemv(x, w_gate_up, ids, gate_up, top_k, x_per_row=False)
    act = (F.silu(gate_up[:, :inter].float()) * gate_up[:, inter:].float()).to(x.dtype)
    down = torch.empty(t * top_k, hidden, dtype=x.dtype, device=x.device)
    _launch_gemv(act, w_down, ids, down, top_k, x_per_row=True)
    return (down.view(t, top_k, hidden).float() * topk_weights.float()[..., None]).sum(1).to(x.dtype)


def _launch_gemv(x, w, ids, out, top_k: int, x_per_row: bool) -> None:
    n, k = w.shape[1], w.shape[2]
    block_n, block_k = 16, 256
    grid = (ids.numel(), triton.cdiv(n, block_n))
    _moe_gemv_kernel[grid](
        x, w, ids, out, n, k, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        TOP_K=top_k, X_PER_ROW=x_per_row, BLOCK_N=block_n, BLOCK_K=block_k,
    )


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _moe_gemv_kernel(
        x_ptr, w_ptr, ids_ptr, out_ptr, N, K, stride_x, stride_we, stride_wn, stride_out,
        TOP_K: tl.constexpr, X_PER_ROW: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        # out[r, n] = sum_k x[row(r), k] * w[ids[r], n, k]; row(r) = r (per-row input) or r // TOP_K (token).
        r = tl.program_id(0)
        nb = tl.program_id(1)
        expert = tl.load(ids_ptr + r).to(tl.int64)
        x_row = r if X_PER_ROW else r // TOP_K
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(x_ptr + x_row * stride_x + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            w_ptrs = w_ptr + expert * stride_we + offs_n[:, None] * stride_wn + offs_k[None, :]
            w = tl.load(w_ptrs, mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0)
            acc += tl.sum(w.to(tl.float32) * xk[None, :], axis=1)
        tl.store(out_ptr + r * stride_out + offs_n, acc.to(out_ptr.dtype.element_ty), mask=offs_n < N)

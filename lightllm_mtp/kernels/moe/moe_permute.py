"""The expert-sorted row layout of the prefill MoE path (fused_moe_grouped) and back, without scatters:

- sort_by_expert: the (token, slot) pairs p = t * k + j in expert order (stable) and each expert's end row
  (searchsorted on the sorted ids: no scatter_add_, and no host sync, which torch.bincount has on CUDA);
- moe_permute: rows[r] = x[order[r] // k] into expert order, and in the same pass pos = the inverse permutation
  (pos[order[r]] = r, each entry written once);
- moe_unpermute: out[t] = sum_j w[t, j] * down[pos[t, j]], a gather-sum over each token's k rows in slot order,
  accumulated in fp32 in registers and written once in down's dtype: no atomics, deterministic."""

from __future__ import annotations

from typing import NamedTuple

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_index, check_shape
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

_PERMUTE_OP = "moe_permute"
_UNPERMUTE_OP = "moe_unpermute"


class CopyTile(NamedTuple):
    """Launch shape of the permute / unpermute kernels: a [rows, cols] tile (powers of two) per program."""

    rows: int
    cols: int
    num_warps: int = 4


def _default_tile(hidden: int) -> CopyTile:
    cols = min(triton.next_power_of_2(hidden), 1024)
    return CopyTile(4096 // cols, cols, 4)  # 4096 elements: 32 per thread on 4 warps


class ExpertOrder(NamedTuple):
    """order int64 [T * k]: pair indices sorted by expert (stable); group_ends int32 [E]: end row of each expert's
    group in that order (torch._grouped_mm's offs)."""

    order: torch.Tensor
    group_ends: torch.Tensor


def sort_by_expert(topk_ids: torch.Tensor, *, num_experts: int) -> ExpertOrder:
    """topk_ids [T, k] with ids in [0, num_experts) (device data, not checked) -> ExpertOrder. No host sync."""
    check_shape("sort_by_expert", "topk_ids", topk_ids, (None, None), "[T, k]")
    check_index("sort_by_expert", "topk_ids", topk_ids)
    if num_experts < 1:
        raise ValueError(f"sort_by_expert: num_experts must be >= 1, got {num_experts}")
    sorted_ids, order = torch.sort(topk_ids.reshape(-1).to(torch.int32), stable=True)
    experts = torch.arange(num_experts, dtype=torch.int32, device=topk_ids.device)
    group_ends = torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)
    return ExpertOrder(order, group_ends)


def moe_permute_ref(x: torch.Tensor, order: torch.Tensor, *, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.empty(order.numel(), dtype=torch.int32, device=x.device)
    pos[order] = torch.arange(order.numel(), dtype=torch.int32, device=x.device)
    return x[order // top_k], pos.view(-1, top_k)


def moe_permute(x: torch.Tensor, order: torch.Tensor, *, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H]; order [T * k] a permutation of the pairs (sort_by_expert; device data, not checked)
    -> (rows [T * k, H] in x.dtype, rows[r] = x[order[r] // k]; pos int32 [T, k], pos[t, j] = the row of pair
    t * k + j)."""
    check_shape(_PERMUTE_OP, "x", x, (None, None), "[T, H]")
    check_float(_PERMUTE_OP, "x", x)
    if top_k < 1:
        raise ValueError(f"{_PERMUTE_OP}: top_k must be >= 1, got {top_k}")
    check_shape(_PERMUTE_OP, "order", order, (x.shape[0] * top_k,), "[T * k]")
    check_index(_PERMUTE_OP, "order", order)
    check_device(_PERMUTE_OP, x=x, order=order)
    if use_triton(x):
        return moe_permute_triton(x, order, top_k=top_k)
    return moe_permute_ref(x, order, top_k=top_k)


def moe_permute_triton(
    x: torch.Tensor, order: torch.Tensor, *, top_k: int, tile: CopyTile | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, hidden = order.numel(), x.shape[1]
    rows = torch.empty(n_rows, hidden, dtype=x.dtype, device=x.device)
    pos = torch.empty(n_rows, dtype=torch.int32, device=x.device)
    if n_rows == 0 or hidden == 0:
        return rows, pos.view(-1, top_k)
    if x.stride(1) != 1:
        x = x.contiguous()
    block_r, block_h, warps = tile or _default_tile(hidden)
    grid = (triton.cdiv(n_rows, block_r), triton.cdiv(hidden, block_h))
    _permute_kernel[grid](
        x, order.contiguous(), rows, pos, n_rows, hidden, x.stride(0),
        TOP_K=top_k, BLOCK_R=block_r, BLOCK_H=block_h, num_warps=warps,
    )  # fmt: skip
    return rows, pos.view(-1, top_k)


def moe_unpermute_ref(down: torch.Tensor, pos: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    weighted = down[pos.long()].float() * topk_weights.float()[..., None]  # [T, k, H]
    return weighted.sum(dim=1).to(down.dtype)


def moe_unpermute(down: torch.Tensor, pos: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """down [T * k, H] (the expert-sorted rows' outputs); pos [T, k] int (moe_permute; device data in
    [0, T * k), not checked); topk_weights [T, k] -> out [T, H] in down.dtype, out[t] = sum_j
    topk_weights[t, j] * down[pos[t, j]], accumulated in fp32."""
    check_shape(_UNPERMUTE_OP, "pos", pos, (None, None), "[T, k]")
    check_index(_UNPERMUTE_OP, "pos", pos)
    t, top_k = pos.shape
    check_shape(_UNPERMUTE_OP, "down", down, (t * top_k, None), "[T * k, H]")
    check_float(_UNPERMUTE_OP, "down", down)
    check_shape(_UNPERMUTE_OP, "topk_weights", topk_weights, (t, top_k), "[T, k]")
    check_float(_UNPERMUTE_OP, "topk_weights", topk_weights)
    check_device(_UNPERMUTE_OP, down=down, pos=pos, topk_weights=topk_weights)
    if use_triton(down):
        return moe_unpermute_triton(down, pos, topk_weights)
    return moe_unpermute_ref(down, pos, topk_weights)


def moe_unpermute_triton(
    down: torch.Tensor, pos: torch.Tensor, topk_weights: torch.Tensor, *, tile: CopyTile | None = None
) -> torch.Tensor:
    t, top_k = pos.shape
    hidden = down.shape[1]
    out = torch.empty(t, hidden, dtype=down.dtype, device=down.device)
    if out.numel() == 0:
        return out
    if down.stride(1) != 1:
        down = down.contiguous()
    block_t, block_h, warps = tile or _default_tile(hidden)
    grid = (triton.cdiv(t, block_t), triton.cdiv(hidden, block_h))
    _unpermute_kernel[grid](
        down, pos, topk_weights, out, t, hidden, down.stride(0), pos.stride(0), pos.stride(1),
        topk_weights.stride(0), topk_weights.stride(1),
        TOP_K=top_k, BLOCK_T=block_t, BLOCK_H=block_h, num_warps=warps,
    )  # fmt: skip
    return out


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _permute_kernel(
        x_ptr, order_ptr, rows_ptr, pos_ptr, R, H, stride_x,
        TOP_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        r_mask = r < R
        pair = tl.load(order_ptr + r, mask=r_mask, other=0)
        if tl.program_id(1) == 0:
            tl.store(pos_ptr + pair, r.to(tl.int32), mask=r_mask)
        token = (pair // TOP_K).to(tl.int64)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = r_mask[:, None] & (h < H)[None, :]
        v = tl.load(x_ptr + token[:, None] * stride_x + h[None, :], mask=mask)
        tl.store(rows_ptr + r.to(tl.int64)[:, None] * H + h[None, :], v, mask=mask)

    @triton.jit
    def _unpermute_kernel(
        down_ptr, pos_ptr, w_ptr, out_ptr, T, H, stride_d, stride_p0, stride_p1, stride_w0, stride_w1,
        TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_mask = t < T
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = t_mask[:, None] & (h < H)[None, :]
        acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
        for j in tl.static_range(TOP_K):  # slot order: the same sum on every run
            row = tl.load(pos_ptr + t * stride_p0 + j * stride_p1, mask=t_mask, other=0).to(tl.int64)
            w = tl.load(w_ptr + t * stride_w0 + j * stride_w1, mask=t_mask, other=0.0).to(tl.float32)
            d = tl.load(down_ptr + row[:, None] * stride_d + h[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += w[:, None] * d
        tl.store(out_ptr + t.to(tl.int64)[:, None] * H + h[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)

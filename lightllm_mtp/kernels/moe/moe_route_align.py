"""Routing and expert alignment of a decode / verify step in one launch: route_topk (softmax top-k, renormalised,
the shared gate's sigmoid as slot k) and moe_align (the expert-major, BLOCK_M-padded pair layout the expert pass
reads) done by ONE Triton program for small steps, nothing written to global memory between the two; larger
steps run the two kernels. Both give the same bits (the routing weights use no layout-dependent reduction).

The one-program bound: pairs P = T * k' <= 64 (35B-A3B, k' = 9: decode B <= 7, a k=1 verify at B <= 3, a k <= 6
verify at B = 1). The program holds a [T, E] logits tile and a [Q, Q] pair-by-pair comparison (Q = T padded x
k' padded <= 128), i.e. <= 16k lanes on 4 warps (one warp for a single row); above that the work of one SM grows as
T * E + Q^2 while the two-kernel path spreads the routing over T programs."""

from __future__ import annotations

from typing import NamedTuple

import torch

from lightllm_mtp.kernels._validate import check_float, check_shape
from lightllm_mtp.kernels.moe.moe_align import max_blocks, moe_align_ref, moe_align_triton
from lightllm_mtp.kernels.moe.moe_routing import route_topk_ref, route_topk_triton
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import next_pow2, triton_available, use_triton

_OP = "route_align"
FUSED_MAX_PAIRS = 64
ROUTE_ALIGN_WARPS = 4
# one row: its E logits sit in one warp's lanes and the top-k reductions need no shared memory (0.9 us per call less
# on the H100, NOTES stop 27)
ONE_ROW_WARPS = 1
_FUSED_MAX_LANES = 16384  # T x E tile of the one program (padded to powers of two)


class RoutedPairs(NamedTuple):
    """weights fp32 [T, k'], ids int32 [T, k'] (route_topk); sorted_pairs int32 [blocks * BLOCK_M] and block_expert
    int32 [blocks] (moe_align; rows of unused blocks are unspecified on CUDA, the sentinel in the reference)."""

    weights: torch.Tensor
    ids: torch.Tensor
    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor


def route_align_ref(
    router_logits: torch.Tensor, *, num_experts: int, top_k: int, shared_gate: bool, block_m: int
) -> RoutedPairs:
    weights, ids = route_topk_ref(router_logits, num_experts=num_experts, top_k=top_k, shared_gate=shared_gate)
    sorted_pairs, block_expert = moe_align_ref(ids, num_experts=num_experts + int(shared_gate), block_m=block_m)
    return RoutedPairs(weights, ids, sorted_pairs, block_expert)


def fused_fits(num_tokens: int, slots: int, num_experts: int, max_pairs: int = FUSED_MAX_PAIRS) -> bool:
    """Whether the one-program kernel takes a step of `num_tokens` rows (see the module docstring)."""
    lanes = next_pow2(num_tokens) * next_pow2(num_experts)
    return 0 < num_tokens * slots <= max_pairs and lanes <= _FUSED_MAX_LANES


def route_align(
    router_logits: torch.Tensor,
    *,
    num_experts: int,
    top_k: int,
    shared_gate: bool,
    block_m: int,
    max_fused_pairs: int = FUSED_MAX_PAIRS,
) -> RoutedPairs:
    """router_logits [T, >= E (+1 with shared_gate)] -> RoutedPairs, renormalised top-k (see route_topk, moe_align).
    On CUDA: one kernel when T * k' <= max_fused_pairs (a benchmark knob; 0 always runs the two kernels), else
    route_topk + moe_align. No host sync, CUDA-graph safe (output sizes depend on T, k', E, block_m only)."""
    check_shape(_OP, "router_logits", router_logits, (None, None), "[T, E]")
    check_float(_OP, "router_logits", router_logits)
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"{_OP}: top_k must be in [1, num_experts={num_experts}], got {top_k}")
    if router_logits.shape[1] < num_experts + int(shared_gate):
        raise ValueError(f"{_OP}: router_logits has {router_logits.shape[1]} columns, needs "
                         f"num_experts={num_experts}{' + 1 (shared gate)' if shared_gate else ''}")  # fmt: skip
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"{_OP}: block_m must be a power of two, got {block_m}")
    if not use_triton(router_logits):
        return route_align_ref(router_logits, num_experts=num_experts, top_k=top_k, shared_gate=shared_gate,
                               block_m=block_m)  # fmt: skip
    slots = top_k + int(shared_gate)
    if fused_fits(router_logits.shape[0], slots, num_experts, max_fused_pairs):
        return route_align_triton(router_logits, num_experts=num_experts, top_k=top_k, shared_gate=shared_gate,
                                  block_m=block_m)  # fmt: skip
    weights, ids = route_topk_triton(router_logits, num_experts=num_experts, top_k=top_k, renormalize=True,
                                     shared_gate=shared_gate)  # fmt: skip
    sorted_pairs, block_expert = moe_align_triton(ids, num_experts=num_experts + int(shared_gate), block_m=block_m)
    return RoutedPairs(weights, ids, sorted_pairs, block_expert)


def route_align_triton(
    router_logits: torch.Tensor, *, num_experts: int, top_k: int, shared_gate: bool, block_m: int
) -> RoutedPairs:
    """The one-program kernel (callers check fused_fits); renormalised weights; ONE_ROW_WARPS for one row, else
    ROUTE_ALIGN_WARPS."""
    t = router_logits.shape[0]
    num_warps = ONE_ROW_WARPS if t == 1 else ROUTE_ALIGN_WARPS
    slots = top_k + int(shared_gate)
    n_pairs = t * slots
    blocks = max_blocks(n_pairs, num_experts + int(shared_gate), block_m)
    dev = router_logits.device
    weights = torch.empty(t, slots, dtype=torch.float32, device=dev)
    ids = torch.empty(t, slots, dtype=torch.int32, device=dev)
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=dev)
    if t == 0:
        return RoutedPairs(weights, ids, sorted_pairs, block_expert)
    if router_logits.stride(1) != 1:
        router_logits = router_logits.contiguous()
    _route_align_kernel[(1,)](
        router_logits, weights, ids, sorted_pairs, block_expert, t, num_experts, router_logits.stride(0), blocks,
        TOP_K=top_k, SLOTS=slots, SHARED_GATE=shared_gate, BLOCK_M=block_m,
        BLOCK_T=triton.next_power_of_2(t), BLOCK_E=triton.next_power_of_2(num_experts),
        BLOCK_S=triton.next_power_of_2(slots), BLOCK_B=triton.next_power_of_2(blocks), num_warps=num_warps,
        **pdl_args(router_logits),
    )  # fmt: skip
    return RoutedPairs(weights, ids, sorted_pairs, block_expert)


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _route_align_kernel(
        logits_ptr, weights_ptr, ids_ptr, sorted_ptr, block_expert_ptr, T, E, stride_l, MAX_BLOCKS,
        TOP_K: tl.constexpr, SLOTS: tl.constexpr, SHARED_GATE: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_B: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        pdl_wait(PDL)
        # 1. routing, all T rows at once: the same per-row arithmetic as _route_topk_kernel
        offs_t = tl.arange(0, BLOCK_T)
        t_valid = offs_t < T
        rows = tl.where(t_valid, offs_t, 0).to(tl.int64)  # padding rows repeat row 0 and are never stored
        offs_e = tl.arange(0, BLOCK_E)
        in_range = offs_e < E
        logits = tl.load(logits_ptr + rows[:, None] * stride_l + offs_e[None, :], mask=in_range[None, :],
                         other=-float("inf")).to(tl.float32)  # fmt: skip
        p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        remaining = tl.where(in_range[None, :], p, -1.0)
        offs_s = tl.arange(0, BLOCK_S)
        top_w = tl.zeros([BLOCK_T, BLOCK_S], dtype=tl.float32)
        top_i = tl.zeros([BLOCK_T, BLOCK_S], dtype=tl.int32)
        denom = tl.zeros([BLOCK_T], dtype=tl.float32)
        for j in tl.static_range(TOP_K):
            best = tl.max(remaining, axis=1)
            best_id = tl.min(tl.where(remaining == best[:, None], offs_e[None, :], BLOCK_E), axis=1)
            top_w = tl.where(offs_s[None, :] == j, best[:, None], top_w)
            top_i = tl.where(offs_s[None, :] == j, best_id[:, None], top_i)
            remaining = tl.where(offs_e[None, :] == best_id[:, None], -1.0, remaining)
            denom += best
        top_w = top_w / denom[:, None]
        if SHARED_GATE:
            gate = tl.load(logits_ptr + rows * stride_l + E).to(tl.float32)
            top_w = tl.where(offs_s[None, :] == TOP_K, (1.0 / (1.0 + tl.exp(-gate)))[:, None], top_w)
            top_i = tl.where(offs_s[None, :] == TOP_K, E, top_i)
        slot_valid = t_valid[:, None] & (offs_s[None, :] < SLOTS)
        pair = offs_t[:, None] * SLOTS + offs_s[None, :]
        tl.store(weights_ptr + pair, top_w, mask=slot_valid)
        tl.store(ids_ptr + pair, top_i, mask=slot_valid)

        # 2. alignment in pair space (q = padded pair index, increasing with the pair index p = t * SLOTS + s):
        # an expert's pairs ranked by p, its first block = the blocks of all lower experts (moe_align's layout)
        Q: tl.constexpr = BLOCK_T * BLOCK_S
        q_ids = tl.reshape(tl.where(slot_valid, top_i, -1), [Q])
        q_pair = tl.reshape(pair, [Q])
        q_valid = q_ids >= 0
        offs_q = tl.arange(0, Q)
        same = (q_ids[:, None] == q_ids[None, :]) & q_valid[None, :]
        count = tl.sum(same.to(tl.int32), axis=1)
        rank = tl.sum((same & (offs_q[None, :] < offs_q[:, None])).to(tl.int32), axis=1)
        n_blocks = (count + BLOCK_M - 1) // BLOCK_M
        lead = q_valid & (rank == 0)  # one per used expert
        lower = lead[None, :] & (q_ids[None, :] < q_ids[:, None])
        first_block = tl.sum(tl.where(lower, n_blocks[None, :], 0), axis=1)
        tl.store(sorted_ptr + first_block * BLOCK_M + rank, q_pair, mask=q_valid)
        offs_m = tl.arange(0, BLOCK_M)  # the sentinel P in the rest of each expert's last block
        pad_at = (first_block * BLOCK_M + count)[:, None] + offs_m[None, :]
        pad_mask = lead[:, None] & (offs_m[None, :] < (n_blocks * BLOCK_M - count)[:, None])
        tl.store(sorted_ptr + pad_at, T * SLOTS + offs_m[None, :] * 0, mask=pad_mask)
        offs_b = tl.arange(0, BLOCK_B)
        in_block = (first_block[None, :] <= offs_b[:, None]) & (offs_b[:, None] < (first_block + n_blocks)[None, :])
        expert = tl.max(tl.where(lead[None, :] & in_block, q_ids[None, :], -1), axis=1)
        tl.store(block_expert_ptr + offs_b, expert, mask=offs_b < MAX_BLOCKS)

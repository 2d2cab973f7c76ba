"""MoE router: softmax top-k with renormalised weights (HF Qwen3_5MoeTopKRouter), in one Triton kernel on CUDA.

`route_topk` also folds the shared expert's sigmoid gate in as an extra (k+1)-th slot: the router GEMM runs over
[experts; shared gate] rows (see `stack_router`), and slot k gets expert id E with weight sigmoid(logit_E), so
the expert pass treats the shared expert as one more expert every token selected."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_float, check_shape
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

_OP = "select_experts"
_ROUTE_OP = "route_topk"


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
    if use_triton(router_logits):
        return route_topk_triton(router_logits, num_experts=router_logits.shape[1], top_k=top_k, renormalize=True,
                                 shared_gate=False, weights_dtype=router_logits.dtype,
                                 ids_dtype=torch.int64)  # fmt: skip
    return select_experts_ref(router_logits, top_k)


def stack_router(router: torch.Tensor, shared_gate: torch.Tensor) -> torch.Tensor:
    """[E, H] router and [1, H] shared-expert gate -> one [E + 1 + pad, H] matrix (zero rows up to a multiple of 8,
    keeping the logits' row stride 16-byte aligned): one GEMM gives the router logits and the shared gate logit."""
    e, h = router.shape
    check_shape("stack_router", "shared_gate", shared_gate, (1, h), "[1, H]")
    rows = -(-(e + 1) // 8) * 8
    out = torch.zeros(rows, h, dtype=router.dtype, device=router.device)
    out[:e] = router
    out[e] = shared_gate[0]
    return out


def route_topk_ref(
    router_logits: torch.Tensor, *, num_experts: int, top_k: int, renormalize: bool = True, shared_gate: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = router_logits.float()
    weights, ids = torch.topk(torch.softmax(logits[:, :num_experts], dim=-1), top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if shared_gate:
        weights = torch.cat([weights, torch.sigmoid(logits[:, num_experts : num_experts + 1])], dim=1)
        ids = torch.cat([ids, torch.full_like(ids[:, :1], num_experts)], dim=1)
    return weights, ids.to(torch.int32)


def route_topk(
    router_logits: torch.Tensor, *, num_experts: int, top_k: int, renormalize: bool = True, shared_gate: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, >= E (+1 with shared_gate)] -> (weights fp32 [T, k'], ids int32 [T, k']), k' = k (+1).

    Slots 0..k-1: the top-k experts by fp32 softmax over columns [0, E), descending, renormalised to sum 1 when
    `renormalize`; ties go to the lower expert id (the Triton kernel; the reference uses torch.topk). The kernel
    computes a renormalised weight as exp(l_j - max) / sum of the k selected exp(l - max) in slot order (equal to
    the reference up to rounding, and the same bits as moe_route_align's fused kernel). With
    `shared_gate`, slot k = (id E, sigmoid(logit column E)). One kernel launch on CUDA, no host sync."""
    check_shape(_ROUTE_OP, "router_logits", router_logits, (None, None), "[T, E]")
    check_float(_ROUTE_OP, "router_logits", router_logits)
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"{_ROUTE_OP}: top_k must be in [1, num_experts={num_experts}], got {top_k}")
    if router_logits.shape[1] < num_experts + int(shared_gate):
        raise ValueError(f"{_ROUTE_OP}: router_logits has {router_logits.shape[1]} columns, needs "
                         f"num_experts={num_experts}{' + 1 (shared gate)' if shared_gate else ''}")  # fmt: skip
    if use_triton(router_logits):
        return route_topk_triton(router_logits, num_experts=num_experts, top_k=top_k, renormalize=renormalize,
                                 shared_gate=shared_gate)  # fmt: skip
    return route_topk_ref(router_logits, num_experts=num_experts, top_k=top_k, renormalize=renormalize,
                          shared_gate=shared_gate)  # fmt: skip


def route_topk_triton(
    router_logits: torch.Tensor,
    *,
    num_experts: int,
    top_k: int,
    renormalize: bool,
    shared_gate: bool,
    weights_dtype: torch.dtype = torch.float32,
    ids_dtype: torch.dtype = torch.int32,
) -> tuple[torch.Tensor, torch.Tensor]:
    t = router_logits.shape[0]
    slots = top_k + int(shared_gate)
    weights = torch.empty(t, slots, dtype=weights_dtype, device=router_logits.device)
    ids = torch.empty(t, slots, dtype=ids_dtype, device=router_logits.device)
    if t == 0:
        return weights, ids
    if router_logits.stride(1) != 1:
        router_logits = router_logits.contiguous()
    block_e = triton.next_power_of_2(num_experts)
    _route_topk_kernel[(t,)](
        router_logits, weights, ids, num_experts, router_logits.stride(0),
        TOP_K=top_k, SLOTS=slots, BLOCK_E=block_e, BLOCK_S=triton.next_power_of_2(slots),
        RENORMALIZE=renormalize, SHARED_GATE=shared_gate, num_warps=4 if block_e >= 512 else 1,
    )  # fmt: skip
    return weights, ids


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _route_topk_kernel(
        logits_ptr, weights_ptr, ids_ptr, E, stride_l,
        TOP_K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr,
        RENORMALIZE: tl.constexpr, SHARED_GATE: tl.constexpr,
    ):  # fmt: skip
        # one token per program: p = exp(logit - max), k rounds of (max, lowest id holding it); renormalised
        # weights p_j / (p_1 + ... + p_k), summed in slot order: no layout-dependent reduction enters a weight, so
        # moe_route_align's one-program kernel gives the same bits
        row = tl.program_id(0).to(tl.int64)
        offs_e = tl.arange(0, BLOCK_E)
        in_range = offs_e < E
        logits = tl.load(logits_ptr + row * stride_l + offs_e, mask=in_range, other=-float("inf")).to(tl.float32)
        p = tl.exp(logits - tl.max(logits, axis=0))
        p = tl.where(in_range, p, 0.0)
        remaining = tl.where(in_range, p, -1.0)
        offs_s = tl.arange(0, BLOCK_S)
        top_w = tl.zeros([BLOCK_S], dtype=tl.float32)
        top_i = tl.zeros([BLOCK_S], dtype=tl.int32)
        denom = 0.0
        for j in tl.static_range(TOP_K):
            best = tl.max(remaining, axis=0)
            best_id = tl.min(tl.where(remaining == best, offs_e, BLOCK_E), axis=0)
            top_w = tl.where(offs_s == j, best, top_w)
            top_i = tl.where(offs_s == j, best_id, top_i)
            remaining = tl.where(offs_e == best_id, -1.0, remaining)
            denom += best
        if RENORMALIZE:
            top_w = top_w / denom
        else:
            top_w = top_w / tl.sum(p, axis=0)
        if SHARED_GATE:
            gate = tl.load(logits_ptr + row * stride_l + E).to(tl.float32)
            top_w = tl.where(offs_s == TOP_K, 1.0 / (1.0 + tl.exp(-gate)), top_w)
            top_i = tl.where(offs_s == TOP_K, E, top_i)
        out_mask = offs_s < SLOTS
        tl.store(weights_ptr + row * SLOTS + offs_s, top_w.to(weights_ptr.dtype.element_ty), mask=out_mask)
        tl.store(ids_ptr + row * SLOTS + offs_s, top_i.to(ids_ptr.dtype.element_ty), mask=out_mask)

"""One token's MoE layer (the B=1 decode step) from its router logits, without a routing launch: every program of
the gate_up kernel routes the token itself (route_align's arithmetic: the same weights and ids, bit for bit), takes
the expert of its slot and makes that expert's activation columns; its first column program also writes the slot's
weight, id and the one-block pair layout (block s = slot s) that the expert pass's down and slot-sum kernels read.
Three launches after the router GEMV instead of four; the output equals route_align + expert_pass_triton's."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels.moe.moe_expert_pass import DECODE_TILES, ExpertPassTiles, down_and_sum_triton
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import triton_available


def one_token_moe_triton(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    shared_gate_up: torch.Tensor,
    shared_down: torch.Tensor,
    *,
    num_experts: int,
    top_k: int,
    tiles: ExpertPassTiles = DECODE_TILES,
) -> torch.Tensor:
    """x [1, H]; router_logits [1, >= E + 1] (the shared gate's logit in column E); weights as fused_moe_shared's,
    unit stride along their last dims (checked by the caller) -> [1, H] in x.dtype."""
    if x.shape[0] != 1 or router_logits.shape[0] != 1:
        raise ValueError(f"one_token_moe: one row, got x {list(x.shape)}, logits {list(router_logits.shape)}")
    slots, hidden = top_k + 1, x.shape[1]
    inter, inter_shared = w_down.shape[2], shared_down.shape[1]
    inter_max = max(inter, inter_shared)
    dev = x.device
    weights = torch.empty(slots, dtype=torch.float32, device=dev)
    ids = torch.empty(slots, dtype=torch.int32, device=dev)
    sorted_pairs = torch.empty(slots * tiles.block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(slots, dtype=torch.int32, device=dev)
    act = torch.empty(slots, inter_max, dtype=x.dtype, device=dev)
    if router_logits.stride(1) != 1:
        router_logits = router_logits.contiguous()
    _route_gate_up_kernel[(slots, triton.cdiv(inter_max, tiles.gate_up_block_n))](
        router_logits, x, w_gate_up, shared_gate_up, weights, ids, sorted_pairs, block_expert, act,
        num_experts, hidden, inter, inter_shared,
        w_gate_up.stride(0), w_gate_up.stride(1), shared_gate_up.stride(0), act.stride(0),
        TOP_K=top_k, SLOTS=slots, BLOCK_E=triton.next_power_of_2(num_experts),
        BLOCK_S=triton.next_power_of_2(slots), BLOCK_M=tiles.block_m, BLOCK_N=tiles.gate_up_block_n,
        BLOCK_K=tiles.gate_up_block_k, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps, num_stages=tiles.gate_up_stages, **pdl_args(x),
    )  # fmt: skip
    return down_and_sum_triton(act, w_down, shared_down, sorted_pairs, block_expert, weights, num_tokens=1,
                               slots=slots, tiles=tiles)  # fmt: skip


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.moe.moe_expert_pass import expert_weights, swiglu_tile
    from lightllm_mtp.kernels.moe.moe_route_align import route_tile
    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _route_gate_up_kernel(
        logits_ptr, x_ptr, w_ptr, shared_w_ptr, weights_ptr, ids_ptr, sorted_ptr, block_expert_ptr, act_ptr,
        E, H, INTER, INTER_SHARED,
        stride_we, stride_wn, stride_shared_wn, stride_act,
        TOP_K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        # act[s, n] = silu(x . gate_e[n]) * (x . up_e[n]), e = the expert of slot s of the token's routing
        pdl_wait(PDL)
        s = tl.program_id(0)
        n0 = tl.program_id(1) * BLOCK_N
        row = tl.arange(0, 1)
        top_w, top_i = route_tile(logits_ptr, row, row < 1, E, 0, TOP_K=TOP_K, SHARED_GATE=True, BLOCK_T=1,
                                  BLOCK_E=BLOCK_E, BLOCK_S=BLOCK_S)  # fmt: skip
        mine = tl.arange(0, BLOCK_S)[None, :] == s
        expert = tl.sum(tl.where(mine, top_i, 0))
        offs_m = tl.arange(0, BLOCK_M)
        if n0 == 0:
            tl.store(weights_ptr + s, tl.sum(tl.where(mine, top_w, 0.0)))
            tl.store(ids_ptr + s, expert)
            tl.store(block_expert_ptr + s, expert)
            tl.store(sorted_ptr + s * BLOCK_M + offs_m, tl.where(offs_m == 0, s, SLOTS))  # SLOTS: no pair
        w_base, stride_n, inter = expert_weights(expert, w_ptr, shared_w_ptr, E, INTER, INTER_SHARED, stride_we,
                                                 stride_wn, stride_shared_wn)  # fmt: skip
        if n0 >= inter:
            return
        valid = offs_m == 0
        token = offs_m.to(tl.int64) * 0
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < inter
        act = swiglu_tile(x_ptr, w_base, token, valid, offs_n, n_mask, inter, stride_n, H, 0, BLOCK_M=BLOCK_M,
                          BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT_PRECISION=DOT_PRECISION)  # fmt: skip
        out_ptrs = act_ptr + s * stride_act + offs_m[:, None] * 0 + offs_n[None, :]
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])

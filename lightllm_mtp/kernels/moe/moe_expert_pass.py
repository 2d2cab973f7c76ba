"""Expert-major fused MoE for decode and verify (small T): rows grouped by expert (moe_align), one tile of up to
BLOCK_M rows reads its expert's gate_up and down weights once.

Launches after the alignment: gate_up GEMM with SwiGLU in its epilogue (one activation row per (token, slot) pair),
a down GEMM writing each pair's weighted row in fp32, and a per-token sum over the slots (a down kernel with the sum
folded in, one program per column tile looping over the experts, was slower at every T on the H100: NOTES stop 26).
No atomics: bitwise repeatable, and a row's result does not depend on the other rows of the step. An optional shared
expert is the extra expert id E (weights in their own tensors, its own intermediate size), selected by slot k of
the routing (route_topk / route_align with shared_gate).

Block-FP8 weights (`scales`, kernels/moe/fp8_moe.py) run w8a8, the checkpoints' "dynamic" activation scheme as
vLLM / SGLang run it: x is rounded to e4m3 per token in 1 x SCALE_K groups (quantize_activations_fp8, one launch per
call), and so is the activation row the gate_up kernel stores (in x's dtype, one more launch); each K step is one
scale block, its e4m3 x e4m3 product runs on the FP8 tensor cores and is multiplied by the row's group scale and the
weight block's scale. Converting every weight element to 16 bits in registers instead (weight-only) made the pass
ALU-bound (the 35B-A3B-FP8 B=1 step 2.86 ms with it, 2.73 with w8a8, on the H200)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels.moe.moe_align import max_blocks, moe_align_triton
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.quant.fp8_gemm import quantize_activations_fp8
from lightllm_mtp.kernels.triton_utils import triton_available


@dataclass(frozen=True)
class ExpertPassTiles:
    """Launch shape of the pass. Decode default: 16 rows per tile (the smallest tensor-core M; a 35B-A3B expert gets
    ~1-3 rows per step at B <= 64, padding compute is free in a weight-read-bound pass); gate_up: 32 intermediate
    columns (x2: gate and up) per program, so an expert of I=512 spreads over 16 programs; down: 64 hidden columns."""

    block_m: int = 16
    gate_up_block_n: int = 32
    gate_up_block_k: int = 128
    down_block_n: int = 64
    down_block_k: int = 128
    num_warps: int = 4
    gate_up_stages: int = 4
    down_stages: int = 3


DECODE_TILES = ExpertPassTiles()
_SUM_BLOCK_H = 512


def expert_pass_ref(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    shared_gate_up: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
    linear=lambda a, w: F.linear(a, w.float()),
) -> torch.Tensor:
    """fp32 math: out[t] = sum_s w[t, s] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, s]; e == E is the
    shared expert (shared_gate_up [2I_s, H], shared_down [H, I_s]) when given. `linear(a, w)`: fp32 rows a [R, K]
    times one expert's stored weight w [N, K]^T in fp32 (a quantized format passes its own product, the rounding of
    a included: kernels/moe/fp8_moe.py)."""
    num_experts = w_gate_up.shape[0]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(topk_ids).tolist():
        token, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        gate_up_w, down_w = (shared_gate_up, shared_down) if e == num_experts else (w_gate_up[e], w_down[e])
        inter = down_w.shape[1]
        gate_up = linear(xf[token], gate_up_w)
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out.index_add_(0, token, linear(h, down_w) * topk_weights[token, slot, None].float())
    return out.to(x.dtype)


def expert_pass_triton(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    shared_gate_up: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
    tiles: ExpertPassTiles = DECODE_TILES,
    alignment: tuple[torch.Tensor, torch.Tensor] | None = None,
    scales: tuple[torch.Tensor, ...] | None = None,
    scale_blocks: tuple[tuple[int, int], tuple[int, int]] = ((1, 1), (1, 1)),
) -> torch.Tensor:
    """Shapes checked by the callers (fused_moe wrappers). Last dims of all weights must have stride 1.
    `alignment`: (sorted_pairs, block_expert) of topk_ids at tiles.block_m when the caller has it (route_align),
    else moe_align runs here. `scales`: block-FP8 weights (kernels/moe/fp8_moe.py): the float8 weights' fp32 block
    scales (gate_up [E, *, *], down [E, *, *], and the shared expert's two when it is given), `scale_blocks` the
    (rows, columns) of the gate_up scales' blocks and of the down scales' (the shared expert's on the same grids);
    the pass then runs w8a8 (module docstring) with K steps of one scale block (the tiles' K steps are not used)."""
    t, slots = topk_ids.shape
    num_experts, hidden = w_gate_up.shape[0], x.shape[1]
    if t == 0:
        return torch.empty_like(x)
    inter = w_down.shape[2]
    has_shared = shared_gate_up is not None
    inter_shared = shared_down.shape[1] if has_shared else inter
    if not has_shared:  # any valid pointer; never read
        shared_gate_up, shared_down = w_gate_up[0], w_down[0]
    fp8 = scales is not None
    if fp8:
        gu_s, down_s = scales[0], scales[1]
        sh_gu_s, sh_down_s = (scales[2], scales[3]) if has_shared else (gu_s[0], down_s[0])
    else:  # any valid pointers; never read
        gu_s, down_s, sh_gu_s, sh_down_s = w_gate_up, w_down, shared_gate_up, shared_down
    (gu_scale_n, gu_scale_k), (down_scale_n, down_scale_k) = scale_blocks
    if fp8:  # the K step is one scale block: one activation group, one weight scale per column
        gate_up_block_k, down_block_k = gu_scale_k, down_scale_k
        x_in, x_scale = quantize_activations_fp8(x, group=gu_scale_k)
    else:  # any valid pointer; never read
        gate_up_block_k, down_block_k = tiles.gate_up_block_k, tiles.down_block_k
        x_in, x_scale = x, x
    if alignment is None:
        alignment = moe_align_triton(topk_ids, num_experts=num_experts + int(has_shared), block_m=tiles.block_m)
    sorted_pairs, block_expert = alignment
    want = max_blocks(topk_ids.numel(), num_experts + int(has_shared), tiles.block_m)
    if block_expert.numel() != want or sorted_pairs.numel() != want * tiles.block_m:
        raise ValueError(f"expert_pass: alignment of {block_expert.numel()} blocks / {sorted_pairs.numel()} rows does "
                         f"not fit {topk_ids.numel()} pairs at block_m={tiles.block_m} ({want} blocks)")  # fmt: skip
    blocks = block_expert.numel()
    n_pairs = t * slots
    inter_max = max(inter, inter_shared)
    weights = topk_weights.reshape(-1)
    if not weights.is_contiguous():
        weights = weights.contiguous()
    dot_precision = "ieee" if x.dtype == torch.float32 else "tf32"
    pdl_kw = pdl_args(x)

    # a row of the narrower of routed / shared experts leaves the columns past its width unwritten; w8a8 zeroes them
    # when they share a rounding group with written ones (that group's scale covers only the row's own values)
    partial_group = fp8 and inter != inter_shared and min(inter, inter_shared) % down_scale_k
    act = (torch.zeros if partial_group else torch.empty)(n_pairs, inter_max, dtype=x.dtype, device=x.device)
    _gate_up_act_kernel[(blocks, triton.cdiv(inter_max, tiles.gate_up_block_n))](
        x_in, x_scale, w_gate_up, shared_gate_up, gu_s, sh_gu_s, sorted_pairs, block_expert, act,
        n_pairs, hidden, inter, inter_shared, num_experts,
        x_in.stride(0), x_scale.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), shared_gate_up.stride(0),
        act.stride(0), gu_s.stride(0), gu_s.stride(1), sh_gu_s.stride(0),
        SLOTS=slots, BLOCK_M=tiles.block_m, BLOCK_N=tiles.gate_up_block_n, BLOCK_K=gate_up_block_k,
        DOT_PRECISION=dot_precision, num_warps=tiles.num_warps, num_stages=tiles.gate_up_stages, W8A8=fp8,
        SCALE_N=gu_scale_n, **pdl_kw,
    )  # fmt: skip
    act_in, act_scale = quantize_activations_fp8(act, group=down_scale_k) if fp8 else (act, act)
    rows = torch.empty(n_pairs, hidden, dtype=torch.float32, device=x.device)
    _down_weighted_kernel[(blocks, triton.cdiv(hidden, tiles.down_block_n))](
        act_in, act_scale, w_down, shared_down, down_s, sh_down_s, sorted_pairs, block_expert, weights, rows,
        n_pairs, hidden, inter, inter_shared, num_experts,
        act_in.stride(0), act_scale.stride(0), w_down.stride(0), w_down.stride(1), shared_down.stride(0),
        rows.stride(0), down_s.stride(0), down_s.stride(1), sh_down_s.stride(0),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.down_block_n, BLOCK_K=down_block_k,
        DOT_PRECISION=dot_precision, num_warps=tiles.num_warps, num_stages=tiles.down_stages, W8A8=fp8,
        SCALE_N=down_scale_n, **pdl_kw,
    )  # fmt: skip
    out = torch.empty(t, hidden, dtype=x.dtype, device=x.device)
    _sum_slots_kernel[(t, triton.cdiv(hidden, _SUM_BLOCK_H))](
        rows, out, hidden, out.stride(0), SLOTS=slots, BLOCK_S=triton.next_power_of_2(slots), BLOCK_H=_SUM_BLOCK_H,
        **pdl_kw,
    )  # fmt: skip
    return out




if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _expert_weights(expert, w_ptr, shared_w_ptr, E, INTER, INTER_SHARED, stride_we, stride_wn, stride_shared_wn):
        # (weights, row stride, intermediate size) of `expert`: id E is the shared expert, in its own tensor
        shared = expert == E
        w_base = tl.where(shared, shared_w_ptr, w_ptr + expert.to(tl.int64) * stride_we)
        return w_base, tl.where(shared, stride_shared_wn, stride_wn), tl.where(shared, INTER_SHARED, INTER)

    @triton.jit
    def _expert_scales(expert, s_ptr, shared_s_ptr, E, stride_se, stride_sn, stride_shared_sn):
        # (scale base, scale row stride) of `expert` for block-FP8 weights
        shared = expert == E
        s_base = tl.where(shared, shared_s_ptr, s_ptr + expert.to(tl.int64) * stride_se)
        return s_base, tl.where(shared, stride_shared_sn, stride_sn)

    @triton.jit
    def _weight_block_scales(s_base, stride_sn, offs_n, n_mask, kb, SCALE_N: tl.constexpr):
        # [BLOCK_N] fp32: each weight row's scale in K block kb
        return tl.load(s_base + (offs_n // SCALE_N).to(tl.int64) * stride_sn + kb, mask=n_mask, other=0.0)

    @triton.jit
    def _gate_up_act_kernel(
        x_ptr, xs_ptr, w_ptr, shared_w_ptr, s_ptr, shared_s_ptr, sorted_ptr, block_expert_ptr, act_ptr,
        P, H, INTER, INTER_SHARED, E,
        stride_x, stride_xs, stride_we, stride_wn, stride_shared_wn, stride_act, stride_se, stride_sn,
        stride_shared_sn,
        SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        DOT_PRECISION: tl.constexpr, W8A8: tl.constexpr, SCALE_N: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        # act[pair, n] = silu(x_tok . gate_e[n]) * (x_tok . up_e[n]) for the BLOCK_M pairs of block b (expert e);
        # W8A8: x_ptr the e4m3 x, xs_ptr its [T, H / BLOCK_K] group scales, BLOCK_K the weights' scale block
        pdl_wait(PDL)
        b = tl.program_id(0)
        n0 = tl.program_id(1) * BLOCK_N
        expert = tl.load(block_expert_ptr + b)
        if expert < 0:
            return
        w_base, stride_n, inter = _expert_weights(expert, w_ptr, shared_w_ptr, E, INTER, INTER_SHARED, stride_we,
                                                  stride_wn, stride_shared_wn)  # fmt: skip
        if n0 >= inter:
            return
        offs_m = tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + b * BLOCK_M + offs_m)
        valid = pair < P
        token = tl.where(valid, pair // SLOTS, 0).to(tl.int64)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < inter
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + token[:, None] * stride_x + offs_k[None, :]
        gate_ptrs = w_base + offs_n[None, :].to(tl.int64) * stride_n + offs_k[:, None]
        up_ptrs = gate_ptrs + inter * stride_n
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if W8A8:
            s_base, stride_sn = _expert_scales(expert, s_ptr, shared_s_ptr, E, stride_se, stride_sn, stride_shared_sn)
            xs_ptrs = xs_ptr + token * stride_xs
        for k0 in range(0, H, BLOCK_K):
            k_mask = offs_k + k0 < H
            xa = tl.load(x_ptrs + k0, mask=valid[:, None] & k_mask[None, :], other=0.0)
            w_mask = k_mask[:, None] & n_mask[None, :]
            w_gate = tl.load(gate_ptrs + k0, mask=w_mask, other=0.0)
            w_up = tl.load(up_ptrs + k0, mask=w_mask, other=0.0)
            if W8A8:  # gate rows n, up rows inter + n of the fused [gate; up] weight
                kb = k0 // BLOCK_K
                x_s = tl.load(xs_ptrs + kb, mask=valid, other=0.0)[:, None]
                s_gate = _weight_block_scales(s_base, stride_sn, offs_n, n_mask, kb, SCALE_N)
                s_up = _weight_block_scales(s_base, stride_sn, offs_n + inter, n_mask, kb, SCALE_N)
                acc_gate += tl.dot(xa, w_gate) * x_s * s_gate[None, :]
                acc_up += tl.dot(xa, w_up) * x_s * s_up[None, :]
            else:
                acc_gate = tl.dot(xa, w_gate, acc_gate, input_precision=DOT_PRECISION)
                acc_up = tl.dot(xa, w_up, acc_up, input_precision=DOT_PRECISION)
        act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
        out_ptrs = act_ptr + tl.where(valid, pair, 0)[:, None].to(tl.int64) * stride_act + offs_n[None, :]
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])

    @triton.jit
    def _down_weighted_kernel(
        act_ptr, as_ptr, w_ptr, shared_w_ptr, s_ptr, shared_s_ptr, sorted_ptr, block_expert_ptr, weights_ptr,
        rows_ptr, P, H, INTER, INTER_SHARED, E,
        stride_act, stride_as, stride_we, stride_wn, stride_shared_wn, stride_rows, stride_se, stride_sn,
        stride_shared_sn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
        W8A8: tl.constexpr, SCALE_N: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        # rows[pair, n] = weight[pair] * (act[row] . down_e[n]) for the BLOCK_M rows of block b, fp32;
        # W8A8: act_ptr the e4m3 act, as_ptr its group scales, BLOCK_K the weights' scale block
        pdl_wait(PDL)
        b = tl.program_id(0)
        n0 = tl.program_id(1) * BLOCK_N
        expert = tl.load(block_expert_ptr + b)
        if expert < 0:
            return
        w_base, stride_n, inter = _expert_weights(expert, w_ptr, shared_w_ptr, E, INTER, INTER_SHARED, stride_we,
                                                  stride_wn, stride_shared_wn)  # fmt: skip
        offs_m = tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + b * BLOCK_M + offs_m)
        valid = pair < P
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < H
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = act_ptr + tl.where(valid, pair, 0)[:, None].to(tl.int64) * stride_act + offs_k[None, :]
        w_ptrs = w_base + offs_n[None, :].to(tl.int64) * stride_n + offs_k[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if W8A8:
            s_base, stride_sn = _expert_scales(expert, s_ptr, shared_s_ptr, E, stride_se, stride_sn, stride_shared_sn)
            as_ptrs = as_ptr + tl.where(valid, pair, 0).to(tl.int64) * stride_as
        for k0 in range(0, inter, BLOCK_K):
            k_mask = offs_k + k0 < inter
            a = tl.load(a_ptrs + k0, mask=valid[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs + k0, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
            if W8A8:
                kb = k0 // BLOCK_K
                a_s = tl.load(as_ptrs + kb, mask=valid, other=0.0)
                acc += tl.dot(a, w) * a_s[:, None] * _weight_block_scales(s_base, stride_sn, offs_n, n_mask, kb,
                                                                          SCALE_N)[None, :]  # fmt: skip
            else:
                acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        weight = tl.load(weights_ptr + pair, mask=valid, other=0.0).to(tl.float32)
        acc = acc * weight[:, None]
        out_ptrs = rows_ptr + pair[:, None].to(tl.int64) * stride_rows + offs_n[None, :]
        tl.store(out_ptrs, acc, mask=valid[:, None] & n_mask[None, :])

    @triton.jit
    def _sum_slots_kernel(rows_ptr, out_ptr, H, stride_out, SLOTS: tl.constexpr, BLOCK_S: tl.constexpr,
                          BLOCK_H: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        pdl_wait(PDL)
        # out[t, :] = sum over the token's SLOTS rows (contiguous, fp32), in a fixed order
        t = tl.program_id(0).to(tl.int64)
        offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_s = tl.arange(0, BLOCK_S)
        mask = (offs_s[:, None] < SLOTS) & (offs_h[None, :] < H)
        vals = tl.load(rows_ptr + (t * SLOTS + offs_s)[:, None] * H + offs_h[None, :], mask=mask, other=0.0)
        tl.store(out_ptr + t * stride_out + offs_h, tl.sum(vals, axis=0).to(out_ptr.dtype.element_ty),
                 mask=offs_h < H)  # fmt: skip

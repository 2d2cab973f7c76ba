"""Per-head q/k RMSNorm followed by partial RoPE, fused: the gated attention's q and k from its projection to the
rows the KV store and the attention read, in one pass instead of three (two norms, then the rotation).

Equals `rmsnorm(q, q_weight)`, `rmsnorm(k, k_weight)` (kernels/norm/rmsnorm.py: zero-centered (1 + w), fp32 math, the
normed value rounded to the activation dtype) then `apply_partial_rope` (kernels/attention/rotary.py: products and
sums rounded to the activation dtype).

Triton path: one program per (token, head) of q then k, holding the whole head: the inverse RMS of the head, then
each output element from its own normed value and its rotation partner's (recomputed from the same inverse RMS).
Heads are read through their strides, so q and k can be views into the fused projection output."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import (
    check_device,
    check_dtype,
    check_float,
    check_index,
    check_same_dtype,
    check_shape,
)
from lightllm_mtp.kernels.attention.rotary import apply_partial_rope_ref
from lightllm_mtp.kernels.norm.rmsnorm import rmsnorm_ref
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

_OP = "qk_norm_rope"


def qk_norm_rope_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    return apply_partial_rope_ref(rmsnorm_ref(q, q_weight, eps), rmsnorm_ref(k, k_weight, eps), positions, cos, sin)


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D] (any strides); q_weight, k_weight [D] (zero-centered RMSNorm weights, one dtype);
    positions [T] int64 / int32; cos, sin [max_positions, R/2] fp32 from build_rope_cache -> (q_out [T, Hq, D],
    k_out [T, Hk, D]), new contiguous tensors in q.dtype.

    Each head is RMS-normalised over D with scale (1 + w), then dims [0, R) rotate as pairs (i, i + R/2) at the
    token's position, dims [R, D) pass through. Positions must be < max_positions (not checked: a host sync)."""
    check_shape(_OP, "q", q, (None, None, None), "[T, Hq, D]")
    check_shape(_OP, "k", k, (q.shape[0], None, q.shape[2]), "[T, Hk, D]")
    check_float(_OP, "q", q)
    check_same_dtype(_OP, "q", q, k=k)
    d = q.shape[2]
    check_shape(_OP, "q_weight", q_weight, (d,), "[D]")
    check_shape(_OP, "k_weight", k_weight, (d,), "[D]")
    check_float(_OP, "q_weight", q_weight)
    check_float(_OP, "k_weight", k_weight)
    check_same_dtype(_OP, "q_weight", q_weight, k_weight=k_weight)
    check_shape(_OP, "positions", positions, (q.shape[0],), "[T]")
    check_index(_OP, "positions", positions)
    check_shape(_OP, "cos", cos, (None, None), "[max_positions, R/2]")
    check_shape(_OP, "sin", sin, tuple(cos.shape), "like cos")
    check_dtype(_OP, "cos", cos, (torch.float32,))
    check_dtype(_OP, "sin", sin, (torch.float32,))
    if 2 * cos.shape[1] > d:
        raise ValueError(f"{_OP}: rotary dim 2 * cos.shape[1] = {2 * cos.shape[1]} exceeds head dim {d}")
    check_device(_OP, q=q, k=k, q_weight=q_weight, k_weight=k_weight, positions=positions, cos=cos, sin=sin)
    if use_triton(q):
        return qk_norm_rope_triton(q, k, q_weight, k_weight, eps, positions, cos, sin)
    return qk_norm_rope_ref(q, k, q_weight, k_weight, eps, positions, cos, sin)


def qk_norm_rope_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton path of qk_norm_rope (arguments validated by the caller)."""
    t, hq, d = q.shape
    hk = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if t == 0 or hq + hk == 0 or d == 0:
        return q_out, k_out
    q = q if q.stride(2) == 1 else q.contiguous()
    k = k if k.stride(2) == 1 else k.contiguous()
    block_d = triton.next_power_of_2(d)
    _qk_norm_rope_kernel[(t, hq + hk)](
        q, k, q_out, k_out, q_weight, k_weight, positions, cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        hq, hk, d, cos.shape[1], eps, BLOCK_D=block_d, num_warps=1 if block_d <= 128 else 2,
    )  # fmt: skip
    return q_out, k_out


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _qk_norm_rope_kernel(
        q_ptr, k_ptr, qo_ptr, ko_ptr, qw_ptr, kw_ptr, pos_ptr, cos_ptr, sin_ptr,
        sq0, sq1, sk0, sk1, sc0, sc1, ss0, ss1, HQ, HK, D, HALF, eps,
        BLOCK_D: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        dt = qo_ptr.dtype.element_ty
        offs = tl.arange(0, BLOCK_D)
        mask_d = offs < D
        rotated = offs < 2 * HALF
        first_half = offs < HALF
        partner = tl.where(first_half, offs + HALF, offs - HALF)
        if h < HQ:  # heads have a unit last stride (the wrapper sees to it)
            src = q_ptr + t * sq0 + h * sq1
            w_ptr = qw_ptr
            dst = qo_ptr + (t * HQ + h) * D
        else:
            src = k_ptr + t * sk0 + (h - HQ) * sk1
            w_ptr = kw_ptr
            dst = ko_ptr + (t * HK + h - HQ) * D
        x = tl.load(src + offs, mask=mask_d, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        w = tl.load(w_ptr + offs, mask=mask_d, other=0.0).to(tl.float32)
        y = (x * rstd * (1.0 + w)).to(dt).to(tl.float32)  # the normed value, as rmsnorm stores it
        xp = tl.load(src + partner, mask=rotated, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=rotated, other=0.0).to(tl.float32)
        yp = (xp * rstd * (1.0 + wp)).to(dt).to(tl.float32)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        j = tl.where(first_half, offs, offs - HALF)  # frequency index of the pair
        c = tl.load(cos_ptr + pos * sc0 + j * sc1, mask=rotated, other=1.0).to(dt).to(tl.float32)
        s = tl.load(sin_ptr + pos * ss0 + j * ss1, mask=rotated, other=0.0).to(dt).to(tl.float32)
        # out_i = y_i c_i - y_{i+h} s_i (i < h), y_i c_i + y_{i-h} s_i (h <= i < R), y_i else; products and the sum
        # rounded to the activation dtype, as apply_partial_rope
        yc = (y * c).to(dt).to(tl.float32)
        ys = (yp * s).to(dt).to(tl.float32)
        out = tl.where(first_half, yc - ys, yc + ys)
        out = tl.where(rotated, out, y)
        tl.store(dst + offs, out.to(dt), mask=mask_d)

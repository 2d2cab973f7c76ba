"""Per-head q/k RMSNorm followed by partial RoPE, fused: the gated attention's q and k from its projection to the
rows the KV store and the attention read, in one pass instead of three (two norms, then the rotation).

Equals `rmsnorm(q, q_weight)`, `rmsnorm(k, k_weight)` (kernels/norm/rmsnorm.py: zero-centered (1 + w), fp32 math, the
normed value rounded to the activation dtype) then `apply_partial_rope` (kernels/attention/rotary.py: products and
sums rounded to the activation dtype).

Triton path: one program per (token, head) of q then k, holding the whole head: the inverse RMS of the head, then
each output element from its own normed value and its rotation partner's (recomputed from the same inverse RMS).
Heads are read through their strides, so q and k can be views into the fused projection output.
`qk_norm_rope_store_kv` also writes k and v into the paged KV pool (store_kv) from the same launch: v heads get
programs of their own, k heads are stored at their pool slot instead of into a k tensor."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import (
    check_device,
    check_float,
    check_same_dtype,
    check_shape,
)
from lightllm_mtp.kernels.attention.rotary import apply_partial_rope_ref, check_rope_args
from lightllm_mtp.kernels.attention.paged_attention import KV_FP8_DTYPE, check_kv_scales
from lightllm_mtp.kernels.attention.store_kv import FP8_MAX, check_store_kv_args, store_kv_ref
from lightllm_mtp.kernels.norm.rmsnorm import rmsnorm_ref
from lightllm_mtp.kernels.pdl import pdl_args
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


def _check(op, q, k, q_weight, k_weight, positions, cos, sin) -> None:
    check_shape(op, "q", q, (None, None, None), "[T, Hq, D]")
    check_shape(op, "k", k, (q.shape[0], None, q.shape[2]), "[T, Hk, D]")
    check_float(op, "q", q)
    check_same_dtype(op, "q", q, k=k)
    d = q.shape[2]
    check_shape(op, "q_weight", q_weight, (d,), "[D]")
    check_shape(op, "k_weight", k_weight, (d,), "[D]")
    check_float(op, "q_weight", q_weight)
    check_float(op, "k_weight", k_weight)
    check_same_dtype(op, "q_weight", q_weight, k_weight=k_weight)
    check_rope_args(op, q, positions, cos, sin)
    check_device(op, q=q, k=k, q_weight=q_weight, k_weight=k_weight, positions=positions, cos=cos, sin=sin)


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
    _check(_OP, q, k, q_weight, k_weight, positions, cos, sin)
    if use_triton(q):
        return qk_norm_rope_triton(q, k, q_weight, k_weight, eps, positions, cos, sin)
    return qk_norm_rope_ref(q, k, q_weight, k_weight, eps, positions, cos, sin)


def qk_norm_rope_store_kv_ref(q, k, v, q_weight, k_weight, eps, positions, cos, sin, k_buffer, v_buffer, mem_index,
                              k_scale=1.0, v_scale=1.0):  # fmt: skip
    q_out, k_out = qk_norm_rope_ref(q, k, q_weight, k_weight, eps, positions, cos, sin)
    store_kv_ref(k_buffer, v_buffer, mem_index, k_out, v, k_scale, v_scale)
    return q_out


def qk_norm_rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    mem_index: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """qk_norm_rope, then store_kv of the new k and v: -> q_out [T, Hq, D] (contiguous, q.dtype); in place,
    k_buffer[mem_index[t]] = k_out[t], v_buffer[mem_index[t]] = v[t] (cast to the pool dtype; an FP8 pool stores
    k_out / k_scale and v / v_scale, saturated).

    q, k, positions, cos, sin, weights as qk_norm_rope; v [T, Hk, D] (any strides); k_buffer, v_buffer [P, Hk, D];
    mem_index [T] int32 / int64 distinct pool slots (not checked against P: a host sync)."""
    op = "qk_norm_rope_store_kv"
    _check(op, q, k, q_weight, k_weight, positions, cos, sin)
    check_store_kv_args(op, k_buffer, v_buffer, mem_index, k, v)
    check_kv_scales(op, k_buffer, k_scale, v_scale)
    if use_triton(q):
        store = (v, k_buffer, v_buffer, mem_index)
        return qk_norm_rope_triton(q, k, q_weight, k_weight, eps, positions, cos, sin, store, (k_scale, v_scale))[0]
    return qk_norm_rope_store_kv_ref(
        q, k, v, q_weight, k_weight, eps, positions, cos, sin, k_buffer, v_buffer, mem_index, k_scale, v_scale
    )


def qk_norm_rope_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    store: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Triton path of qk_norm_rope (arguments validated by the caller); store = (v, k_buffer, v_buffer, mem_index):
    the qk_norm_rope_store_kv form (k goes to the pool, the second result is None)."""
    t, hq, d = q.shape
    hk = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device) if store is None else None
    if t == 0 or hq + hk == 0 or d == 0:
        return q_out, k_out
    q = q if q.stride(2) == 1 else q.contiguous()
    k = k if k.stride(2) == 1 else k.contiguous()
    if store is None:
        v, k_dst, v_dst, mem_index = k, k_out, k_out, positions  # v programs are not launched
        sk_dst, sv_src, sv_dst = (hk * d, d), (0, 0), (0, 0)
    else:
        v, k_dst, v_dst, mem_index = store
        v = v if v.stride(2) == 1 else v.contiguous()
        sk_dst, sv_src, sv_dst = k_dst.stride()[:2], v.stride()[:2], v_dst.stride()[:2]
    pool_fp8 = store is not None and k_dst.dtype == KV_FP8_DTYPE
    block_d = triton.next_power_of_2(d)
    _qk_norm_rope_kernel[(t, hq + hk * (1 if store is None else 2))](
        q, k, v, q_out, k_dst, v_dst, q_weight, k_weight, positions, mem_index, cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), *sv_src, *sk_dst, *sv_dst,
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        hq, hk, d, cos.shape[1], eps, 1.0 / kv_scales[0], 1.0 / kv_scales[1], TO_POOL=store is not None,
        POOL_FP8=pool_fp8, FP8_MAX_VALUE=FP8_MAX, BLOCK_D=block_d,
        num_warps=1 if block_d <= 128 else 2, **pdl_args(q),
    )  # fmt: skip
    return q_out, k_out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _qk_norm_rope_kernel(
        q_ptr, k_ptr, v_ptr, qo_ptr, kd_ptr, vd_ptr, qw_ptr, kw_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr,
        sq0, sq1, sk0, sk1, sv0, sv1, skd0, skd1, svd0, svd1, sc0, sc1, ss0, ss1, HQ, HK, D, HALF, eps,
        inv_k_scale, inv_v_scale, TO_POOL: tl.constexpr, POOL_FP8: tl.constexpr, FP8_MAX_VALUE: tl.constexpr,
        BLOCK_D: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl_wait(PDL)
        # programs (t, h): h < HQ a q head, then HK k heads (to kd: k_out rows, or pool slot rows when TO_POOL), then
        # (TO_POOL) HK v heads copied to their pool slot rows; heads have a unit last stride (the wrapper sees to it)
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        dt = qo_ptr.dtype.element_ty
        offs = tl.arange(0, BLOCK_D)
        mask_d = offs < D
        if h < HQ + HK:
            rotated = offs < 2 * HALF
            first_half = offs < HALF
            partner = tl.where(first_half, offs + HALF, offs - HALF)
            if h < HQ:
                src = q_ptr + t * sq0 + h * sq1
                w_ptr = qw_ptr
            else:
                src = k_ptr + t * sk0 + (h - HQ) * sk1
                w_ptr = kw_ptr
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
            # out_i = y_i c_i - y_{i+h} s_i (i < h), y_i c_i + y_{i-h} s_i (h <= i < R), y_i else; products and the
            # sum rounded to the activation dtype, as apply_partial_rope
            yc = (y * c).to(dt).to(tl.float32)
            ys = (yp * s).to(dt).to(tl.float32)
            out = tl.where(first_half, yc - ys, yc + ys)
            out = tl.where(rotated, out, y).to(dt)
            if h < HQ:
                tl.store(qo_ptr + (t * HQ + h) * D + offs, out, mask=mask_d)
            elif TO_POOL:
                slot = tl.load(slot_ptr + t).to(tl.int64)
                if POOL_FP8:  # stored = k / k_scale, saturated
                    kv = tl.clamp(out.to(tl.float32) * inv_k_scale, -FP8_MAX_VALUE, FP8_MAX_VALUE)
                else:
                    kv = out
                tl.store(kd_ptr + slot * skd0 + (h - HQ) * skd1 + offs, kv.to(kd_ptr.dtype.element_ty), mask=mask_d)
            else:
                tl.store(kd_ptr + t * skd0 + (h - HQ) * skd1 + offs, out, mask=mask_d)
        else:
            slot = tl.load(slot_ptr + t).to(tl.int64)
            hv = h - HQ - HK
            val = tl.load(v_ptr + t * sv0 + hv * sv1 + offs, mask=mask_d, other=0.0)
            if POOL_FP8:
                val = tl.clamp(val.to(tl.float32) * inv_v_scale, -FP8_MAX_VALUE, FP8_MAX_VALUE)
            tl.store(vd_ptr + slot * svd0 + hv * svd1 + offs, val.to(vd_ptr.dtype.element_ty), mask=mask_d)

"""Partial NeoX-style rotary embedding (rotate-half on the first rotary_dim dims of each head).

Text-only Qwen3.5 uses interleaved mRoPE with equal T/H/W positions, which is ordinary 1-D RoPE.

Triton path: one launch for q and k, one program per (token, head) over the whole head dim (rotated pairs and the
pass-through tail), with the reference's roundings to the activation dtype."""

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
from lightllm_mtp.config.rope_scaling import RopeScaling
from lightllm_mtp.kernels.attention.rope_frequencies import rope_inv_freq
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

_OP = "apply_partial_rope"


def build_rope_cache(
    rotary_dim: int, max_positions: int, theta: float, device: torch.device | str | None = None,
    scaling: RopeScaling | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (cos, sin), each [max_positions, rotary_dim // 2] fp32; inv_freq_j = theta^(-2j / rotary_dim), or those of
    a RoPE scaling (kernels/attention/rope_frequencies.py), whose attention factor (YaRN's mscale) multiplies cos and
    sin here, as in HF, before the kernels round them to the activation dtype."""
    if max_positions <= 0:
        raise ValueError(f"build_rope_cache: max_positions must be positive, got {max_positions}")
    inv_freq, attention_factor = rope_inv_freq(rotary_dim, theta, scaling)
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return (freqs.cos() * attention_factor).to(device), (freqs.sin() * attention_factor).to(device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def check_rope_args(op: str, q: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """positions [T] (T = q's rows) and the cos / sin cache [max_positions, R/2] fp32 with R <= q's head dim."""
    check_shape(op, "positions", positions, (q.shape[0],), "[T]")
    check_index(op, "positions", positions)
    check_shape(op, "cos", cos, (None, None), "[max_positions, R/2]")
    check_shape(op, "sin", sin, tuple(cos.shape), "like cos")
    check_dtype(op, "cos", cos, (torch.float32,))
    check_dtype(op, "sin", sin, (torch.float32,))
    if 2 * cos.shape[1] > q.shape[2]:
        raise ValueError(f"{op}: rotary dim 2 * cos.shape[1] = {2 * cos.shape[1]} exceeds head dim {q.shape[2]}")


def apply_partial_rope_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # HF casts cos/sin to the activation dtype and rotates in that dtype; we do the same.
    c = cos[positions].to(q.dtype)[:, None, :]
    s = sin[positions].to(q.dtype)[:, None, :]
    return _rotate(q, c, s), _rotate(k, c, s)


def apply_partial_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D], positions [T] int64 (int32 accepted), cos/sin [max_positions, R/2] fp32
    from build_rope_cache -> (q_out, k_out), new tensors like q and k.

    Dims [0, R) of every head rotate as pairs (i, i + R/2); dims [R, D) pass through. Positions must be
    < max_positions (not checked: that would need a host sync)."""
    check_shape(_OP, "q", q, (None, None, None), "[T, Hq, D]")
    check_shape(_OP, "k", k, (q.shape[0], None, q.shape[2]), "[T, Hk, D]")
    check_float(_OP, "q", q)
    check_same_dtype(_OP, "q", q, k=k)
    check_rope_args(_OP, q, positions, cos, sin)
    check_device(_OP, q=q, k=k, positions=positions, cos=cos, sin=sin)
    if use_triton(q):
        return apply_partial_rope_triton(q, k, positions, cos, sin)
    return apply_partial_rope_ref(q, k, positions, cos, sin)


def apply_partial_rope_triton(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    t, hq, d = q.shape
    hk = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if t == 0 or hq + hk == 0 or d == 0:
        return q_out, k_out
    q = q if q.stride(2) == 1 else q.contiguous()
    k = k if k.stride(2) == 1 else k.contiguous()
    cos = cos if cos.stride(1) == 1 else cos.contiguous()
    sin = sin if sin.stride(1) == 1 else sin.contiguous()
    block_d = triton.next_power_of_2(d)
    _partial_rope_kernel[(t, hq + hk)](
        q, k, q_out, k_out, positions, cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        hq, hk, d, cos.shape[1], BLOCK_D=block_d, num_warps=1 if block_d <= 256 else 2,
    )
    return q_out, k_out


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_head(x_ptr, o_ptr, c, s, offs, partner, mask_d, first_half, rotated):
        """Rotates one head: out_i = x_i c_i - x_{i+h} s_i (i < h), x_i c_i + x_{i-h} s_i (h <= i < R), x_i else.
        Every product and the sum are rounded to the activation dtype, as the reference computes in it."""
        dt = o_ptr.dtype.element_ty
        x = tl.load(x_ptr + offs, mask=mask_d, other=0.0).to(tl.float32)
        xp = tl.load(x_ptr + partner, mask=rotated, other=0.0).to(tl.float32)
        xc = (x * c).to(dt).to(tl.float32)
        xs = (xp * s).to(dt).to(tl.float32)
        y = tl.where(first_half, xc - xs, xc + xs)
        y = tl.where(rotated, y, x)
        tl.store(o_ptr + offs, y.to(dt), mask=mask_d)

    @triton.jit
    def _partial_rope_kernel(
        q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cos_ptr, sin_ptr,
        sq0, sq1, sk0, sk1, s_cos, s_sin, HQ, HK, D, HALF,
        BLOCK_D: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        offs = tl.arange(0, BLOCK_D)
        mask_d = offs < D
        rotated = offs < 2 * HALF
        first_half = offs < HALF
        partner = tl.where(first_half, offs + HALF, offs - HALF)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        j = tl.where(first_half, offs, offs - HALF)  # frequency index of the pair
        dt = qo_ptr.dtype.element_ty
        c = tl.load(cos_ptr + pos * s_cos + j, mask=rotated, other=1.0).to(dt).to(tl.float32)
        s = tl.load(sin_ptr + pos * s_sin + j, mask=rotated, other=0.0).to(dt).to(tl.float32)
        if h < HQ:
            _rope_head(q_ptr + t * sq0 + h * sq1, qo_ptr + (t * HQ + h) * D, c, s, offs, partner, mask_d,
                       first_half, rotated)
        else:
            _rope_head(k_ptr + t * sk0 + (h - HQ) * sk1, ko_ptr + (t * HK + h - HQ) * D, c, s, offs, partner,
                       mask_d, first_half, rotated)

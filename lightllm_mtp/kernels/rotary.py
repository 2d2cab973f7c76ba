"""Partial NeoX-style rotary embedding (rotate-half on the first rotary_dim dims of each head).

Text-only Qwen3.5 uses interleaved mRoPE with equal T/H/W positions, which is ordinary 1-D RoPE."""

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

_OP = "apply_partial_rope"


def build_rope_cache(
    rotary_dim: int, max_positions: int, theta: float, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (cos, sin), each [max_positions, rotary_dim // 2] fp32; inv_freq_j = theta^(-2j / rotary_dim)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"build_rope_cache: rotary_dim must be a positive even number, got {rotary_dim}")
    if max_positions <= 0:
        raise ValueError(f"build_rope_cache: max_positions must be positive, got {max_positions}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos().to(device), freqs.sin().to(device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


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
    check_shape(_OP, "positions", positions, (q.shape[0],), "[T]")
    check_index(_OP, "positions", positions)
    check_shape(_OP, "cos", cos, (None, None), "[max_positions, R/2]")
    check_shape(_OP, "sin", sin, tuple(cos.shape), "like cos")
    check_dtype(_OP, "cos", cos, (torch.float32,))
    check_dtype(_OP, "sin", sin, (torch.float32,))
    if 2 * cos.shape[1] > q.shape[2]:
        raise ValueError(f"{_OP}: rotary dim 2 * cos.shape[1] = {2 * cos.shape[1]} exceeds head dim {q.shape[2]}")
    check_device(_OP, q=q, k=k, positions=positions, cos=cos, sin=sin)
    return apply_partial_rope_ref(q, k, positions, cos, sin)

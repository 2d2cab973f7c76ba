"""RoPE inverse frequencies and the cos / sin attention factor of each RopeScaling type (config/rope_scaling.py).

Each formula is written as HF's rope utils compute it (transformers/modeling_rope_utils.py and Qwen3.5's default
init), operation for operation in fp32 on the CPU, so that the frequencies are the same bits as HF's."""

from __future__ import annotations

import math

import torch

from lightllm_mtp.config.rope_scaling import RopeScaling


def rope_inv_freq(rotary_dim: int, theta: float, scaling: RopeScaling | None = None) -> tuple[torch.Tensor, float]:
    """-> (inv_freq [rotary_dim // 2] fp32 on the CPU, attention factor cos and sin are multiplied by)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rope_inv_freq: rotary_dim must be a positive even number, got {rotary_dim}")
    if scaling is None:
        return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)), 1.0
    if scaling.rope_type == "linear":
        return _default(rotary_dim, theta) / scaling.factor, 1.0
    if scaling.rope_type == "yarn":
        return _yarn(rotary_dim, theta, scaling), scaling.attention_factor
    if scaling.rope_type == "llama3":
        return _llama3(rotary_dim, theta, scaling), 1.0
    raise ValueError(f"rope_inv_freq: unknown rope_type {scaling.rope_type!r}")


def _default(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def _yarn(dim: int, base: float, s: RopeScaling) -> torch.Tensor:
    """Frequencies that turn fewer than beta_slow times over the original window are divided by factor
    (interpolation), those that turn more than beta_fast times are kept (extrapolation), a linear ramp between."""

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(s.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevents a division by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (s.factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    return inv_freq_interpolation * (1 - extrapolation_factor) + inv_freq_extrapolation * extrapolation_factor


def _llama3(dim: int, base: float, s: RopeScaling) -> torch.Tensor:
    """Wavelengths above original / low_freq_factor divided by factor, below original / high_freq_factor kept, a
    smooth blend between."""
    inv_freq = _default(dim, base)
    old_context_len = s.original_max_position_embeddings
    low_freq_wavelen = old_context_len / s.low_freq_factor
    high_freq_wavelen = old_context_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_context_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / s.factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)

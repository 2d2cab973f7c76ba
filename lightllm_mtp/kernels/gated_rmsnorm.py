"""Gated RMSNorm of the Gated DeltaNet output (norm before gate, plain weight), HF Qwen3_5RMSNormGated."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape

_OP = "gated_rmsnorm"


def gated_rmsnorm_ref(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = weight * normed  # in the promoted dtype of weight and x, as HF does
    return (y * F.silu(z.float())).to(x.dtype)


def gated_rmsnorm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H, D] (any leading dims), z (gate) like x, weight [D] -> [T, H, D] in x.dtype.

    y = w * (x * rsqrt(mean(x^2) + eps)) * silu(z): the normalized x is rounded to x.dtype before the weight
    multiply, silu(z) is taken in fp32, the result is cast back to x.dtype."""
    if x.ndim < 1:
        raise ValueError(f"{_OP}: x must have at least 1 dim [..., D], got a scalar")
    check_float(_OP, "x", x)
    check_shape(_OP, "z", z, tuple(x.shape), "like x")
    check_same_dtype(_OP, "x", x, z=z)
    check_shape(_OP, "weight", weight, (x.shape[-1],), "[D]")
    check_float(_OP, "weight", weight)
    check_device(_OP, x=x, z=z, weight=weight)
    return gated_rmsnorm_ref(x, z, weight, eps)

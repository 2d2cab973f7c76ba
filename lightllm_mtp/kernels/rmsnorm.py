"""Zero-centered Qwen3.5 RMSNorm (`y = x * rsqrt(mean(x^2) + eps) * (1 + w)`) and its fused residual-add form."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape

_OP = "rmsnorm"
_OP_ADD = "add_rmsnorm"


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + weight.float())).to(x.dtype)


def add_rmsnorm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    new_residual = (x + residual).to(x.dtype)
    return rmsnorm_ref(new_residual, weight, eps), new_residual


def _check(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.ndim < 1:
        raise ValueError(f"{op}: x must have at least 1 dim [..., N], got a scalar")
    check_float(op, "x", x)
    check_shape(op, "weight", weight, (x.shape[-1],), "[N]")
    check_float(op, "weight", weight)
    check_device(op, x=x, weight=weight)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., N], weight [N] (zero-centered: the scale is 1 + weight) -> [..., N] in x.dtype.

    Computes in fp32 and casts the product with (1 + w) to x.dtype once (HF Qwen3_5RMSNorm)."""
    _check(_OP, x, weight)
    return rmsnorm_ref(x, weight, eps)


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., N], residual [..., N] (same dtype), weight [N] -> (normed, new_residual), both [..., N] in x.dtype.

    new_residual = x + residual (rounded to x.dtype); normed = rmsnorm(new_residual, weight, eps)."""
    _check(_OP_ADD, x, weight)
    check_shape(_OP_ADD, "residual", residual, tuple(x.shape), "[..., N] like x")
    check_same_dtype(_OP_ADD, "x", x, residual=residual)
    check_device(_OP_ADD, x=x, residual=residual)
    return add_rmsnorm_ref(x, residual, weight, eps)

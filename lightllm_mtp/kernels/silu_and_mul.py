"""SwiGLU activation of a fused gate|up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_float

_OP = "silu_and_mul"


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]) * x[..., half:]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] (any leading dims; gate = first I columns, up = last I) -> silu(gate) * up [T, I] in x.dtype."""
    if x.ndim < 1 or x.shape[-1] % 2:
        raise ValueError(f"{_OP}: x must be [..., 2I] with an even last dim, got shape {list(x.shape)}")
    check_float(_OP, "x", x)
    return silu_and_mul_ref(x)

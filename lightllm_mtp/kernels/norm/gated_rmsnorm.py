"""Gated RMSNorm of the Gated DeltaNet output (norm before gate, plain weight), HF Qwen3_5RMSNormGated.

Triton path: one program per tile of BLOCK_H rows (value heads of one token), fp32 math with the reference's
roundings to x.dtype. Heads of 128 are short rows: a tile of several fills the program's warps with 16-byte loads
(one program per head ran 1 warp on 256 bytes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape
from lightllm_mtp.kernels.norm.rmsnorm import as_rows3
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

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
    if use_triton(x):
        return gated_rmsnorm_triton(x, z, weight, eps)
    return gated_rmsnorm_ref(x, z, weight, eps)


def gated_rmsnorm_triton(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, block_h: int | None = None
) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    xv, zv, ov = as_rows3(x), as_rows3(z), as_rows3(out)
    r0, r1, n = xv.shape
    block_n = triton.next_power_of_2(n)
    if block_h is None:  # up to 2048 elements a program, at most the rows there are
        block_h = min(triton.next_power_of_2(r1), max(1, 2048 // block_n))
    warps = min(8, max(1, block_h * block_n // 512))
    # w * normed is rounded to x.dtype exactly when torch's type promotion of (weight, x) gives x.dtype
    round_wx = torch.promote_types(weight.dtype, x.dtype) == x.dtype
    _gated_rmsnorm_kernel[(r0, triton.cdiv(r1, block_h))](
        xv, zv, weight, ov, xv.stride(0), xv.stride(1), zv.stride(0), zv.stride(1), ov.stride(0), ov.stride(1),
        r1, n, eps, ROUND_WX=round_wx, BLOCK_H=block_h, BLOCK_N=block_n, num_warps=warps, **pdl_args(x),
    )
    return out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _gated_rmsnorm_kernel(
        x_ptr, z_ptr, w_ptr, out_ptr, sx0, sx1, sz0, sz1, so0, so1, R1, N, eps,
        ROUND_WX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl_wait(PDL)
        # rows (i, j0 .. j0 + BLOCK_H) of the [R0, R1, N] views, each normalised over its N columns
        i = tl.program_id(0).to(tl.int64)
        j = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
        offs = tl.arange(0, BLOCK_N)
        mask = (j < R1)[:, None] & (offs < N)[None, :]
        dt = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + i * sx0 + j[:, None] * sx1 + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        normed = (x * rstd[:, None]).to(dt).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=offs < N, other=0.0).to(tl.float32)
        y = w[None, :] * normed
        if ROUND_WX:
            y = y.to(dt).to(tl.float32)
        z = tl.load(z_ptr + i * sz0 + j[:, None] * sz1 + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        y = y * (z / (1.0 + tl.exp(-z)))
        tl.store(out_ptr + i * so0 + j[:, None] * so1 + offs[None, :], y.to(dt), mask=mask)

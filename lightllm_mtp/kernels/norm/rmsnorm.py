"""Zero-centered Qwen3.5 RMSNorm (`y = x * rsqrt(mean(x^2) + eps) * (1 + w)`) and its fused residual-add form.

Triton path: one program per row of N, fp32 math, rows addressed through two leading strides, so strided views
such as the q/k heads of a fused projection ([T, H, D] with a row stride != H * D) need no copy."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

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
    if use_triton(x):
        return rmsnorm_triton(x, weight, eps)
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
    if use_triton(x):
        return add_rmsnorm_triton(x, residual, weight, eps)
    return add_rmsnorm_ref(x, residual, weight, eps)


def as_rows3(x: torch.Tensor) -> torch.Tensor:
    """x [..., N] -> a [R0, R1, N] view of it with a unit last stride (a contiguous copy only when no such view
    exists). R0 * R1 rows; kernels address row (i, j) as i * stride(0) + j * stride(1)."""
    n = x.shape[-1]
    if x.ndim == 1:
        v = x.view(1, 1, n)
    elif x.ndim == 2:
        v = x.unsqueeze(1)
    else:
        try:
            v = x.view(-1, x.shape[-2], n)
        except RuntimeError:
            v = x.contiguous().view(-1, x.shape[-2], n)
    if v.stride(2) != 1 and n > 1:
        v = v.contiguous()
    return v


def row_launch_params(n: int) -> tuple[int, int]:
    """-> (BLOCK_N, num_warps) for one program per row of n elements."""
    block = triton.next_power_of_2(max(n, 1))
    return block, min(8, max(1, block // 512))


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    xv, ov = as_rows3(x), as_rows3(out)
    r0, r1, n = xv.shape
    block, warps = row_launch_params(n)
    _rmsnorm_kernel[(r0, r1)](
        xv, xv, weight, ov, ov, xv.stride(0), xv.stride(1), 0, 0, ov.stride(0), ov.stride(1), 0, 0, n, eps,
        HAS_RESIDUAL=False, BLOCK_N=block, num_warps=warps, **pdl_args(x),
    )
    return out


def add_rmsnorm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_res = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out, new_res
    xv, rv = as_rows3(x), as_rows3(residual)
    ov, nv = as_rows3(out), as_rows3(new_res)
    r0, r1, n = xv.shape
    block, warps = row_launch_params(n)
    _rmsnorm_kernel[(r0, r1)](
        xv, rv, weight, ov, nv, xv.stride(0), xv.stride(1), rv.stride(0), rv.stride(1), ov.stride(0), ov.stride(1),
        nv.stride(0), nv.stride(1), n, eps, HAS_RESIDUAL=True, BLOCK_N=block, num_warps=warps, **pdl_args(x),
    )
    return out, new_res


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _rmsnorm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr,
        sx0, sx1, sr0, sr1, so0, so1, sn0, sn1, N, eps,
        HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl_wait(PDL)
        # Row (i, j): out = s * rsqrt(mean(s^2) + eps) * (1 + w), s = x (+ residual, rounded to x's dtype).
        i = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1).to(tl.int64)
        offs = tl.arange(0, BLOCK_N)
        mask = offs < N
        x = tl.load(x_ptr + i * sx0 + j * sx1 + offs, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + i * sr0 + j * sr1 + offs, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(new_res_ptr + i * sn0 + j * sn1 + offs, x, mask=mask)
        xf = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = xf * rstd * (1.0 + w)
        tl.store(out_ptr + i * so0 + j * so1 + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

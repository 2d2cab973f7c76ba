"""SwiGLU activation of a fused gate|up projection.

Triton path: one program per (row, column block), reference roundings (silu(gate) rounded to x.dtype before the
product)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_float
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

_OP = "silu_and_mul"


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]) * x[..., half:]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] (any leading dims; gate = first I columns, up = last I) -> silu(gate) * up [T, I] in x.dtype."""
    if x.ndim < 1 or x.shape[-1] % 2:
        raise ValueError(f"{_OP}: x must be [..., 2I] with an even last dim, got shape {list(x.shape)}")
    check_float(_OP, "x", x)
    if use_triton(x):
        return silu_and_mul_triton(x)
    return silu_and_mul_ref(x)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    inter = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], inter, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    try:
        xv = x.view(-1, 2 * inter)
    except RuntimeError:
        xv = x.reshape(-1, 2 * inter)
    if xv.stride(1) != 1:
        xv = xv.contiguous()
    block = min(1024, triton.next_power_of_2(inter))
    _silu_and_mul_kernel[(xv.shape[0], triton.cdiv(inter, block))](
        xv, out, xv.stride(0), inter, BLOCK=block, num_warps=4 if block >= 512 else 1, **pdl_args(x)
    )
    return out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, I, BLOCK: tl.constexpr, PDL: tl.constexpr):
        pdl_wait(PDL)
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < I
        dt = out_ptr.dtype.element_ty
        gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_x + I + offs, mask=mask, other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
        tl.store(out_ptr + row * I + offs, (act * up).to(dt), mask=mask)

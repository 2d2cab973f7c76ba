"""Output gate of gated full attention: o * sigmoid(gate).

Triton path: one program per (row, column block); rows are addressed through two leading strides, so a gate sliced
head by head out of a projection ([T, H, D], heads interleaved with the queries) is read in place, without a copy."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape
from lightllm_mtp.kernels.norm.rmsnorm import as_rows3
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

_OP = "sigmoid_gate_mul"


def sigmoid_gate_mul_ref(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(gate)


def sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x [..., N], gate like x (same shape and dtype, any strides) -> x * sigmoid(gate), a new contiguous tensor like
    x in x.dtype (sigmoid rounded to the dtype first, as HF does)."""
    if x.ndim < 1:
        raise ValueError(f"{_OP}: x must have at least 1 dim [..., N], got a scalar")
    check_shape(_OP, "gate", gate, tuple(x.shape), "like x")
    check_float(_OP, "x", x)
    check_same_dtype(_OP, "x", x, gate=gate)
    check_device(_OP, x=x, gate=gate)
    if use_triton(x):
        return sigmoid_gate_mul_triton(x, gate)
    return sigmoid_gate_mul_ref(x, gate)


def sigmoid_gate_mul_triton(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    xv, gv, ov = as_rows3(x), as_rows3(gate), as_rows3(out)
    r0, r1, n = xv.shape
    block = min(1024, triton.next_power_of_2(n))
    _sigmoid_gate_mul_kernel[(r0 * r1, triton.cdiv(n, block))](
        xv, gv, ov, xv.stride(0), xv.stride(1), gv.stride(0), gv.stride(1), ov.stride(0), ov.stride(1), r1, n,
        BLOCK=block, num_warps=4 if block >= 512 else (2 if block >= 256 else 1), **pdl_args(x),
    )
    return out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _sigmoid_gate_mul_kernel(x_ptr, gate_ptr, out_ptr, sx0, sx1, sg0, sg1, so0, so1, R1, N, BLOCK: tl.constexpr,
                                 PDL: tl.constexpr):
        pdl_wait(PDL)
        # row (i, j) of the [R0, R1, N] views; one flat program axis (R0 * R1 may exceed a grid dimension's limit)
        r = tl.program_id(0).to(tl.int64)
        i = r // R1
        j = r % R1
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        dt = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + i * sx0 + j * sx1 + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(gate_ptr + i * sg0 + j * sg1 + offs, mask=mask, other=0.0).to(tl.float32)
        s = (1.0 / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(out_ptr + i * so0 + j * so1 + offs, (x * s).to(dt), mask=mask)

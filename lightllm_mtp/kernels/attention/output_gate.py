"""Output gate of gated full attention: o * sigmoid(gate).

Triton path: one program per (row, column block); rows may be strided (e.g. a gate sliced out of a projection)."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

_OP = "sigmoid_gate_mul"


def sigmoid_gate_mul_ref(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(gate)


def sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x [T, N], gate [T, N] (same dtype) -> x * sigmoid(gate) [T, N] in x.dtype (sigmoid rounded to the dtype
    first, as HF does)."""
    check_shape(_OP, "x", x, (None, None), "[T, N]")
    check_shape(_OP, "gate", gate, tuple(x.shape), "[T, N]")
    check_float(_OP, "x", x)
    check_same_dtype(_OP, "x", x, gate=gate)
    check_device(_OP, x=x, gate=gate)
    if use_triton(x):
        return sigmoid_gate_mul_triton(x, gate)
    return sigmoid_gate_mul_ref(x, gate)


def sigmoid_gate_mul_triton(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    t, n = x.shape
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x = x if x.stride(1) == 1 else x.contiguous()
    gate = gate if gate.stride(1) == 1 else gate.contiguous()
    block = min(1024, triton.next_power_of_2(n))
    _sigmoid_gate_mul_kernel[(t, triton.cdiv(n, block))](
        x, gate, out, x.stride(0), gate.stride(0), n, BLOCK=block, num_warps=4 if block >= 512 else 1
    )
    return out


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _sigmoid_gate_mul_kernel(x_ptr, gate_ptr, out_ptr, stride_x, stride_g, N, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        dt = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(gate_ptr + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
        s = (1.0 / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(out_ptr + row * N + offs, (x * s).to(dt), mask=mask)

"""Output gate of gated full attention: o * sigmoid(gate)."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape

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
    return sigmoid_gate_mul_ref(x, gate)

"""Gated DeltaNet gates: log-decay g and write strength beta."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape

_OP = "gdn_gating"


def gdn_gating_ref(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b).float()  # sigmoid in the input dtype, as HF
    return g, beta


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b [T, nv]; A_log, dt_bias [nv] -> (g [T, nv] fp32, beta [T, nv] fp32).

    g = -exp(A_log) * softplus(a + dt_bias) in fp32 (softplus threshold 20); beta = sigmoid(b) taken in b.dtype,
    then widened to fp32."""
    check_shape(_OP, "a", a, (None, None), "[T, nv]")
    check_shape(_OP, "b", b, tuple(a.shape), "[T, nv]")
    check_float(_OP, "a", a)
    check_same_dtype(_OP, "a", a, b=b)
    check_shape(_OP, "A_log", A_log, (a.shape[1],), "[nv]")
    check_shape(_OP, "dt_bias", dt_bias, (a.shape[1],), "[nv]")
    check_float(_OP, "A_log", A_log)
    check_float(_OP, "dt_bias", dt_bias)
    check_device(_OP, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    return gdn_gating_ref(a, b, A_log, dt_bias)

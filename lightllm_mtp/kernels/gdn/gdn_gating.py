"""Gated DeltaNet gates: log-decay g and write strength beta.

`gdn_gates` is the in-kernel form (also used by the fused GDN decode in gated_delta_rule)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape
from lightllm_mtp.kernels.triton_utils import triton_available, use_triton

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
    if use_triton(a):
        return gdn_gating_triton(a, b, A_log, dt_bias)
    return gdn_gating_ref(a, b, A_log, dt_bias)


def gdn_gating_triton(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    t, nv = a.shape
    g = torch.empty(t, nv, dtype=torch.float32, device=a.device)
    beta = torch.empty(t, nv, dtype=torch.float32, device=a.device)
    if g.numel() == 0:
        return g, beta
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if b.stride(1) == 1 else b.contiguous()
    _gdn_gating_kernel[(t,)](
        a, b, A_log, dt_bias, g, beta, a.stride(0), b.stride(0), nv, BLOCK=triton.next_power_of_2(nv), num_warps=1
    )
    return g, beta


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def gdn_gates(a, b, A_log, dt_bias):
        """a, b as loaded (b in its own dtype: the sigmoid is rounded to it, as the reference); A_log, dt_bias
        -> (g, beta) fp32. g = -exp(A_log) * softplus(a + dt_bias), softplus linear above 20."""
        x = a.to(tl.float32) + dt_bias.to(tl.float32)
        u = tl.exp(tl.minimum(x, 20.0))
        w = 1.0 + u
        # log1p(u) to full precision for small u: log(w) * u / (w - 1) corrects the rounding of 1 + u
        exact = w == 1.0
        sp = tl.where(exact, u, tl.log(w) * (u / tl.where(exact, 1.0, w - 1.0)))
        sp = tl.where(x > 20.0, x, sp)
        g = -tl.exp(A_log.to(tl.float32)) * sp
        bf = b.to(tl.float32)
        beta = (1.0 / (1.0 + tl.exp(-bf))).to(b.dtype).to(tl.float32)
        return g, beta

    @triton.jit
    def _gdn_gating_kernel(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, stride_a, stride_b, NV,
                           BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < NV
        a = tl.load(a_ptr + row * stride_a + offs, mask=mask, other=0.0)
        b = tl.load(b_ptr + row * stride_b + offs, mask=mask, other=0.0)
        A_log = tl.load(A_log_ptr + offs, mask=mask, other=0.0)
        dt_bias = tl.load(dt_bias_ptr + offs, mask=mask, other=0.0)
        g, beta = gdn_gates(a, b, A_log, dt_bias)
        tl.store(g_ptr + row * NV + offs, g, mask=mask)
        tl.store(beta_ptr + row * NV + offs, beta, mask=mask)

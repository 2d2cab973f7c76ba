"""The w8a8 block-FP8 GEMM through torch._scaled_mm's blockwise mode (cuBLAS on Hopper): activations rounded per token
to e4m3 with a scale per 1 x 128 group (the Triton quantizer of fp8_gemm.py), the weight's 128 x 128 blocks as
stored. The same rounding as fp8_gemm_triton(act_fp8=True); measured faster than it at 256 and 4096 rows on all six
27B / 35B-A3B projection shapes (benchmark/results/fp8_gemm_vs_bf16_h200.json), and from 128 rows on outputs >= 4096
wide (results/fp8_few_rows_w8a8_h200.json): fp8_linear.py gives it those calls, prefill chunks and large verify blocks."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_float, check_shape
from lightllm_mtp.kernels.quant.fp8_block import Fp8BlockWeight
from lightllm_mtp.kernels.quant.fp8_gemm import fp8_gemm_ref, quantize_activations_fp8

_OP = "fp8_scaled_mm"
SCALED_MM_BLOCK = (128, 128)
_M_ALIGN = 16


def fp8_scaled_mm_ref(x: torch.Tensor, weight: Fp8BlockWeight) -> torch.Tensor:
    return fp8_gemm_ref(x, weight, act_fp8=True)


def scaled_mm_fits(x: torch.Tensor, weight: Fp8BlockWeight) -> bool:
    """_scaled_mm's blockwise mode takes this call: a CUDA device of compute capability 9.0 (Hopper), bf16
    activations, 128 x 128 weight blocks, N and K multiples of 128."""
    if not (x.is_cuda and hasattr(torch, "_scaled_mm") and x.dtype == torch.bfloat16):
        return False
    n, k = weight.shape
    return (weight.block == SCALED_MM_BLOCK and n % 128 == 0 and k % 128 == 0
            and torch.cuda.get_device_capability(x.device) == (9, 0))  # fmt: skip


def fp8_scaled_mm(x: torch.Tensor, *, weight: Fp8BlockWeight) -> torch.Tensor:
    """x [M, K] bf16 @ weight [N, K]^T -> [M, N] bf16 (scaled_mm_fits must hold). The weight's scales enter in the
    layout cuBLAS takes: [N/128, K/128] with K/128 padded to a multiple of 4, passed transposed; the activation scales
    column-major."""
    check_shape(_OP, "x", x, (None, weight.shape[1]), "[M, K] with the weight's K")
    check_float(_OP, "x", x)
    if not scaled_mm_fits(x, weight):
        raise ValueError(f"{_OP}: needs bf16 activations on an sm90 GPU and 128 x 128 blocks over N, K % 128 == 0")
    m = x.shape[0]
    if m % _M_ALIGN:  # cuBLAS's FP8 GEMMs take row counts divisible by 16 only (CUBLAS_STATUS_NOT_SUPPORTED else)
        x = torch.nn.functional.pad(x, (0, 0, 0, _M_ALIGN - m % _M_ALIGN))
    q, s = quantize_activations_fp8(x, group=SCALED_MM_BLOCK[1])
    k_blocks = weight.scale.shape[1]
    w_scale = torch.zeros(weight.scale.shape[0], -(-k_blocks // 4) * 4, dtype=torch.float32, device=x.device)
    w_scale[:, :k_blocks] = weight.scale
    out = torch._scaled_mm(q, weight.qweight.t(), scale_a=s.t().contiguous().t(), scale_b=w_scale.t(),
                           out_dtype=torch.bfloat16)  # fmt: skip
    return out[:m]

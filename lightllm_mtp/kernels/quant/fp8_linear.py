"""x @ W^T with a block-FP8 W: which kernel runs for which rows.

On CUDA: up to FP8_GEMV_MAX_ROWS rows the GEMV (decode at small batches); up to WEIGHT_ONLY_MAX_ROWS the tiled
GEMM dequantizing the weight into 16-bit tensor-core products (batched decode and verify blocks, exact activations;
measured 1.5-2.5x slower than the w8a8 GEMM at those rows on the H200, benchmark/results/fp8_gemm_vs_bf16_h200.json,
see benchmark/NOTES.md "Stop 38"); above, w8a8 with per-token 1 x 128 activation scales (prefill: FP8 tensor cores):
torch._scaled_mm's blockwise mode where it takes the call (fp8_scaled_mm.py: faster on every measured shape), else
the Triton w8a8 GEMM. Off CUDA (and with LIGHTLLM_MTP_FORCE_REFERENCE_KERNELS) the weight-only reference: fp32
products of the dequantized weight, the same for every row count, so that a CPU forward's rows do not depend on their
batch."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels.quant.fp8_block import Fp8BlockWeight
from lightllm_mtp.kernels.quant.fp8_gemm import fp8_gemm_ref, fp8_gemm_tiles, fp8_gemm_triton
from lightllm_mtp.kernels.quant.fp8_scaled_mm import fp8_scaled_mm, scaled_mm_fits
from lightllm_mtp.kernels.triton_utils import num_sms, use_triton

WEIGHT_ONLY_MAX_ROWS = 256  # a B=64, k=3 verify; prefill chunks are larger


def fp8_linear(x: torch.Tensor, weight: Fp8BlockWeight) -> torch.Tensor:
    """x [T, K] @ weight [N, K]^T -> [T, N] in x.dtype."""
    if not use_triton(x):
        return fp8_gemm_ref(x, weight, act_fp8=False)
    rows = x.shape[0]
    if rows <= WEIGHT_ONLY_MAX_ROWS:
        n, k = weight.shape
        tiles = fp8_gemm_tiles(rows, n, k, weight.block[1], num_sms(x.device))
        return fp8_gemm_triton(x, weight=weight, act_fp8=False, **tiles)
    if scaled_mm_fits(x, weight):  # prefill: cuBLAS's blockwise w8a8
        return fp8_scaled_mm(x, weight=weight)
    return fp8_gemm_triton(x, weight=weight, act_fp8=True)

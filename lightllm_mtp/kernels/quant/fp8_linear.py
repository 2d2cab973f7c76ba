"""x @ W^T with a block-FP8 W: which kernel runs for which rows.

On CUDA: up to WEIGHT_ONLY_MAX_ROWS rows (decode, verify blocks) the tiled GEMM weight-only with its few-row launch
shapes (fp8_gemm_tiles: rows padded to 16, K split for narrow outputs): the e4m3 weight converted exactly to bf16 on
the 16-bit tensor cores, exact activations, the CPU reference's rounding; H200 (benchmark/NOTES.md "Stop 39"): 2.3-2.6
TB/s of FP8 weight at 1-16 rows, 1.2-1.4x faster than bf16 on the 27B projections, slower than bf16 at 32+ rows.
Above, w8a8 with per-token 1 x 128 activation scales (prefill: FP8 tensor cores):
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

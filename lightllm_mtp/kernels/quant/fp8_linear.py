"""x @ W^T with a block-FP8 W: which kernel runs for which rows.

On CUDA, from the H200 check (benchmark/results/fp8_gemm_vs_bf16_h200.json, each path against its own rounding's
reference): the w8a8 GEMM (activations rounded per token to e4m3 with a scale per 1 x 128 group, FP8 tensor cores;
what vLLM / SGLang run for these checkpoints) for every row count, except 1..FP8_GEMV_MAX_ROWS rows of an output
narrower than WIDE_OUTPUT, where the weight-only GEMV is faster (27B down / out projections at one row: 63 / 23 us
vs 89 / 32). The weight-only GEMM measured 1.5-2.5x slower than w8a8 at every shape and row count, so it only backs
the exact-activation check. Off CUDA (and with LIGHTLLM_MTP_FORCE_REFERENCE_KERNELS) the weight-only reference:
fp32 products of the dequantized weight, the same for every row count, so that a CPU forward's rows do not depend on
their batch."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels.quant.fp8_block import Fp8BlockWeight
from lightllm_mtp.kernels.quant.fp8_gemm import fp8_gemm_triton
from lightllm_mtp.kernels.quant.fp8_gemv import FP8_GEMV_MAX_ROWS, fp8_gemv_ref, fp8_gemv_triton
from lightllm_mtp.kernels.triton_utils import use_triton

WEIGHT_ONLY_MAX_ROWS = 4  # rows up to which a narrow output keeps exact activations (the GEMV)
WIDE_OUTPUT = 8192  # outputs at least this wide take the w8a8 GEMM at every row count (27B in_proj 32.6 vs 59.8 us)


def fp8_linear(x: torch.Tensor, weight: Fp8BlockWeight) -> torch.Tensor:
    """x [T, K] @ weight [N, K]^T -> [T, N] in x.dtype."""
    if not use_triton(x):
        return fp8_gemv_ref(x, weight)
    rows = x.shape[0]
    if 0 < rows <= min(FP8_GEMV_MAX_ROWS, WEIGHT_ONLY_MAX_ROWS) and weight.shape[0] < WIDE_OUTPUT:
        return fp8_gemv_triton(x, weight=weight)
    return fp8_gemm_triton(x, weight=weight, act_fp8=True)

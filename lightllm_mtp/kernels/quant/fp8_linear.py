"""x @ W^T with a block-FP8 W: which kernel runs for which rows.

On CUDA every path is w8a8, the checkpoints' "dynamic" activation scheme (as vLLM / SGLang run it): the
activations are rounded to e4m3 per token in 1 x 128 groups (fp8_gemm.quantize_activations_fp8) and each weight
block's product runs on the FP8 tensor cores, scaled by the row's group scale times the block's scale; decode, verify
and prefill rows share that rounding. Measured on the H200 (benchmark/NOTES.md "Stop 40",
results/fp8_few_rows_w8a8_h200.json):
- up to SCALED_MM_MIN_ROWS - 1 rows (decode, verify blocks), and narrow outputs at any few-row count: the tiled Triton
  GEMM with its few-row launch shapes (fp8_gemm_tiles: rows padded to 16, K split for narrow outputs): 2.1-3.5 TB/s
  of FP8 weight at 1-16 rows, 1.14-1.59x faster than bf16 on the 27B projections at these launch shapes (the out
  projection the least); 1.2-2.7x faster than the weight-only conversion it replaced, which lost to bf16 from 32
  rows on. At 128-256 rows some narrow shapes stay slower than bf16 (27B down / out, the 35B-A3B out projection);
- from SCALED_MM_MIN_ROWS rows on outputs of at least SCALED_MM_MIN_OUT: torch._scaled_mm's blockwise mode where it
  takes the call (fp8_scaled_mm.py; prefill chunks and verify blocks of 65+ rows, inside CUDA graphs too), else the
  Triton GEMM (fp8_gemm_tiles' launch shapes up to FEW_ROWS_MAX rows, its 64 x 128 defaults above).
Off CUDA (and with LIGHTLLM_MTP_FORCE_REFERENCE_KERNELS) the weight-only reference: exact activations, fp32 products
of the dequantized weight, the same for every row count. Not the GPU's rounding, on purpose: e4m3 rounding is a step
function, so it turns the last-bit differences between a verify block and a decode row (attention over k + 1 rows,
GDN chunks) into 2^-4 jumps of single activations, and a CPU forward could no longer be the exact oracle the tests
hold speculative decoding and tensor parallelism to (MTP == plain, tp == one process, to the token). What the GPU's
rounding adds is bounded by the kernels' tests and measured on the model in unit_tests/models/test_fp8_checkpoint.py."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels.quant.fp8_block import Fp8BlockWeight
from lightllm_mtp.kernels.quant.fp8_gemm import FEW_ROWS_MAX_BLOCK_M, fp8_gemm_ref, fp8_gemm_tiles, fp8_gemm_triton
from lightllm_mtp.kernels.quant.fp8_scaled_mm import fp8_scaled_mm, scaled_mm_fits
from lightllm_mtp.kernels.triton_utils import num_sms, use_triton

SCALED_MM_MIN_ROWS = 65  # 27B shapes at 128-256 rows: cuBLAS 1.0-1.7x faster; at <= 64 the Triton GEMM 1.1-2.8x
SCALED_MM_MIN_OUT = 4096  # the 35B-A3B [2048, 4096] output projection stays on Triton at 128-256 rows (1.2-1.6x)
FEW_ROWS_MAX = 4 * FEW_ROWS_MAX_BLOCK_M  # rows up to which the Triton GEMM takes fp8_gemm_tiles' launch shapes


def fp8_linear(x: torch.Tensor, weight: Fp8BlockWeight) -> torch.Tensor:
    """x [T, K] @ weight [N, K]^T -> [T, N] in x.dtype."""
    if not use_triton(x):
        return fp8_gemm_ref(x, weight, act_fp8=False)
    rows = x.shape[0]
    n, k = weight.shape
    if rows >= SCALED_MM_MIN_ROWS and n >= SCALED_MM_MIN_OUT and scaled_mm_fits(x, weight):
        return fp8_scaled_mm(x, weight=weight)
    if rows <= FEW_ROWS_MAX:
        tiles = fp8_gemm_tiles(rows, n, k, weight.block[1], num_sms(x.device), act_fp8=True)
        return fp8_gemm_triton(x, weight=weight, act_fp8=True, **tiles)
    return fp8_gemm_triton(x, weight=weight, act_fp8=True)

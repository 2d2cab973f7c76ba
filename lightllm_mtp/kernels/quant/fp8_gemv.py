"""y = x @ W^T for a few rows (decode at small batches) with a block-FP8 W: the weight's FP8 bytes are streamed once,
in its [out, in] layout, and dequantized in registers (each K tile reshaped into its scale blocks and multiplied by
their scales) before the fp32 products; the tiles and the one-pass, no-split-K structure of kernels/linear/gemv.py,
with the tiles of an FP8 sweep on the H200. Measured there (results/fp8_gemv_tiles_h200.json) it streams 1.3-1.5
TB/s against the bf16 GEMV's 3.5: per call it is 1.2-1.4x SLOWER than the bf16 GEMV on the same shape (its
fp8 -> fp32 conversion and per-element rescale, not the bytes, bound it); a one-scale-block K step and a
[rows, blocks, 128] tile were measured 2x slower still."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_shape
from lightllm_mtp.kernels.linear.gemv import GEMV_MAX_OUT, GEMV_MAX_ROWS, gemv_tiles
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.quant.fp8_block import Fp8BlockWeight
from lightllm_mtp.kernels.triton_utils import next_pow2, num_sms, triton_available

_OP = "fp8_gemv"
FP8_GEMV_MAX_ROWS = GEMV_MAX_ROWS


def fp8_gemv_ref(x: torch.Tensor, weight: Fp8BlockWeight) -> torch.Tensor:
    """fp32 math on the dequantized weight, rounded to x.dtype once."""
    return (x.float() @ weight.dequantize(torch.float32).t()).to(x.dtype)


def fp8_gemv_tiles(rows: int, n: int, k: int, block_k: int, sms: int) -> tuple[int, int, int]:
    """(T_PAD, BLOCK_N, BLOCK_K): one or two rows of a wide output, 4 weight rows per program and K steps of 1024 /
    2048 (the H200 sweep, results/fp8_gemv_tiles_h200.json: the best or within 5% on the six 27B / 35B-A3B shapes,
    1.1-1.3x faster than the bf16 GEMV's tiles); else the bf16 GEMV's tiles. K steps are multiples of the scale
    block."""
    t_pad, block_n, block_k_tile = gemv_tiles(rows, n, k, sms)
    if rows <= 2 and n > GEMV_MAX_OUT:
        block_n, block_k_tile = 4, min(1024 * rows, next_pow2(k))
    return t_pad, block_n, max(block_k_tile, block_k)


def fp8_gemv_triton(
    x: torch.Tensor, *, weight: Fp8BlockWeight, tiles: tuple[int, int, int] | None = None, num_warps: int = 4
) -> torch.Tensor:
    """x [T, K] (T <= FP8_GEMV_MAX_ROWS, 16/32-bit) @ weight [N, K]^T -> [T, N] in x.dtype, fp32 accumulation.
    tiles (T_PAD, BLOCK_N, BLOCK_K) and num_warps: the launch shape (default fp8_gemv_tiles), for sweeps."""
    if not isinstance(weight, Fp8BlockWeight) or weight.ndim != 2:
        raise ValueError(f"{_OP}: weight must be a 2-D Fp8BlockWeight [N, K]")
    check_shape(_OP, "x", x, (None, weight.shape[1]), "[T, K] with the weight's K")
    check_float(_OP, "x", x)
    check_device(_OP, x=x, qweight=weight.qweight)
    t, k = x.shape
    n = weight.shape[0]
    if not 0 < t <= FP8_GEMV_MAX_ROWS:
        raise ValueError(f"{_OP}: x must have 1..{FP8_GEMV_MAX_ROWS} rows, got {t}")
    if x.stride(1) != 1:
        x = x.contiguous()
    q, s = weight.qweight, weight.scale
    if q.stride(1) != 1 or s.stride(1) != 1:
        raise ValueError(f"{_OP}: weight and scale rows must be contiguous")
    block_n, block_k = weight.block
    t_pad, tile_n, tile_k = tiles or fp8_gemv_tiles(t, n, k, block_k, num_sms(x.device))
    if t_pad < t or tile_k % block_k:
        raise ValueError(f"{_OP}: tiles {tiles} must hold {t} rows and a K step that is a multiple of {block_k}")
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    _fp8_gemv_kernel[(triton.cdiv(n, tile_n),)](
        x, q, s, out, t, n, k, x.stride(0), q.stride(0), s.stride(0), out.stride(0),
        SCALE_N=block_n, SCALE_K=block_k, T_PAD=t_pad, BLOCK_N=tile_n, BLOCK_K=tile_k, num_warps=num_warps,
        **pdl_args(x),
    )  # fmt: skip
    return out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _fp8_gemv_kernel(
        x_ptr, w_ptr, s_ptr, out_ptr, T, N, K, stride_x, stride_w, stride_s, stride_out,
        SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, T_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        pdl_wait(PDL)
        KB: tl.constexpr = BLOCK_K // SCALE_K  # scale blocks per K step
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_t = tl.arange(0, T_PAD)
        n_mask = offs_n < N
        t_mask = offs_t < T
        scale_rows = s_ptr + (offs_n // SCALE_N)[:, None].to(tl.int64) * stride_s
        k_blocks = tl.cdiv(K, SCALE_K)
        acc = tl.zeros([T_PAD, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_w + offs_k[None, :],
                        mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)  # fmt: skip
            offs_kb = k0 // SCALE_K + tl.arange(0, KB)
            s = tl.load(scale_rows + offs_kb[None, :], mask=n_mask[:, None] & (offs_kb < k_blocks)[None, :], other=0.0)
            w = tl.reshape(tl.reshape(w, (BLOCK_N, KB, SCALE_K)) * s[:, :, None], (BLOCK_N, BLOCK_K))
            xs = tl.load(x_ptr + offs_t[:, None] * stride_x + offs_k[None, :], mask=t_mask[:, None] & k_mask[None, :],
                         other=0.0)  # fmt: skip
            acc += tl.sum(xs.to(tl.float32)[:, None, :] * w[None, :, :], axis=2)
        out_ptrs = out_ptr + offs_t[:, None] * stride_out + offs_n[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=t_mask[:, None] & n_mask[None, :])

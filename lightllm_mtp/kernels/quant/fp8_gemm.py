"""y = x @ W^T with a block-FP8 W at every row count: decode and verify rows (padded to the dot's 16, with
`fp8_gemm_tiles`' launch shapes: K split for narrow outputs, the partial tiles summed in split order by each tile's
last program) and prefill.

Two modes of one tiled tl.dot kernel, K tiles of one scale block each:
- weight-only (`act_fp8=False`): each e4m3 weight tile is converted (exactly) to x's dtype and multiplied on the
  16-bit tensor cores; each scale block's fp32 products are multiplied by the block's scale once;
- w8a8 (`act_fp8=True`, the checkpoints' "dynamic" activation scheme): x is quantized per token in 1 x block_k
  groups (`quantize_activations_fp8`), each tile product runs on the FP8 tensor cores and is scaled by its row's
  group scale times the weight block's scale: the mode the engine runs at every row count on CUDA (fp8_linear.py).
The w8a8 result differs from the weight-only one by the activation rounding: e4m3 keeps 3 mantissa bits, a relative
error of at most 2^-4 per element (in its normal range); as a share of |x| |w| a row's product error stays below
2^-4 / sqrt(3) (unit_tests/kernels/quant/test_fp8_linear.py measures 0.06% mean, 0.38% max on random data)."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_shape
from lightllm_mtp.kernels.quant.fp8_block import FP8_DTYPE, FP8_MAX, Fp8BlockWeight
from lightllm_mtp.kernels.triton_utils import next_pow2, triton_available

_OP = "fp8_gemm"
_QUANT_OP = "quantize_activations_fp8"
_MIN_ACT_SCALE = 1e-10  # an all-zero group keeps a finite scale


def quantize_activations_ref(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] e4m3, scale [M, ceil(K / group)] fp32) with x ~ q * scale per 1 x group."""
    m, k = x.shape
    groups = -(-k // group)
    padded = torch.nn.functional.pad(x.float(), (0, groups * group - k)).reshape(m, groups, group)
    scale = padded.abs().amax(dim=-1).clamp_min(_MIN_ACT_SCALE) / FP8_MAX
    q = (padded / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).reshape(m, groups * group)[:, :k]
    return q.contiguous(), scale


def fp8_gemm_ref(x: torch.Tensor, weight: Fp8BlockWeight, *, act_fp8: bool) -> torch.Tensor:
    """fp32 math; act_fp8: x first rounded as the w8a8 kernel rounds it."""
    xf = x.float()
    if act_fp8:
        q, s = quantize_activations_ref(x, weight.block[1])
        xf = q.float() * s.repeat_interleave(weight.block[1], dim=1)[:, : x.shape[1]]
    return (xf @ weight.dequantize(torch.float32).t()).to(x.dtype)


def quantize_activations_fp8(x: torch.Tensor, *, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton per-token-group quantization of quantize_activations_ref (CUDA or the interpreter)."""
    check_shape(_QUANT_OP, "x", x, (None, None), "[M, K]")
    check_float(_QUANT_OP, "x", x)
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    groups = triton.cdiv(k, group)
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    if m:
        _quantize_act_kernel[(m, groups)](x, q, scale, k, x.stride(0), q.stride(0), scale.stride(0),
                                          MIN_SCALE=_MIN_ACT_SCALE, FP8_MAX_VALUE=FP8_MAX, GROUP=group)  # fmt: skip
    return q, scale


FEW_ROWS_MAX_BLOCK_M = 64
_MIN_K_BLOCKS_PER_SPLIT = 8
_MAX_SPLIT_K = 8
# output tiles x K splits wanted per SM: the weight-only mode converts every weight element (more programs hide
# it), the w8a8 mode's FP8 dot does not and loses to extra splits (H200 sweeps, NOTES "Stop 39" / "Stop 40")
_PROGRAMS_PER_SM = {False: 6, True: 2}


def fp8_gemm_tiles(rows: int, n: int, k: int, block_k: int, sms: int, *, act_fp8: bool) -> dict:
    """Launch shape at decode / verify row counts: rows padded to the dot's 16 (one row tile up to 64 rows), 64-wide
    output tiles (w8a8: 32-wide at 32-64 rows), and K split until the output tiles times the splits give every SM
    its programs (narrow outputs over a long K: the 27B down / out projections). H200 sweeps over the six 27B /
    35B-A3B shapes at 1-64 rows: weight-only 1.035x the best launch shape of each (shape, rows) on average, 1.31x at
    worst (results/fp8_few_rows_split_h200.json); w8a8 1.033x, 1.20x at worst (results/fp8_few_rows_w8a8_h200.json)."""
    block_m = max(16, min(FEW_ROWS_MAX_BLOCK_M, next_pow2(rows)))
    block_n = 32 if act_fp8 and 32 <= rows <= 64 else 64
    tiles = -(-rows // block_m) * -(-n // block_n)
    k_blocks = -(-k // block_k)
    split = 1
    while (tiles * split < _PROGRAMS_PER_SM[act_fp8] * sms and split < _MAX_SPLIT_K
           and k_blocks // (2 * split) >= _MIN_K_BLOCKS_PER_SPLIT):  # fmt: skip
        split *= 2
    return dict(block_m=block_m, block_n=block_n, split_k=split, num_stages=4, num_warps=4)


def fp8_gemm_triton(
    x: torch.Tensor, *, weight: Fp8BlockWeight, act_fp8: bool, block_m: int = 64, block_n: int = 128,
    num_warps: int = 4, num_stages: int = 3, quantize_in_kernel: bool = False, split_k: int = 1,
) -> torch.Tensor:  # fmt: skip
    """x [M, K] (16/32-bit) @ weight [N, K]^T -> [M, N] in x.dtype, fp32 accumulation. block_m / block_n: the output
    tile; the K tile is the weight's scale block. quantize_in_kernel (w8a8 only): each program rounds its own
    activation tiles (the same per-group rounding as quantize_activations_fp8) instead of a separate launch.
    split_k: programs per output tile, each over a contiguous share of K (narrow outputs with a long K give too few
    tiles to keep HBM busy); their fp32 partial tiles are summed by the tile's last program in split order, so the
    result does not depend on which program finishes first."""
    if not isinstance(weight, Fp8BlockWeight) or weight.ndim != 2:
        raise ValueError(f"{_OP}: weight must be a 2-D Fp8BlockWeight [N, K]")
    check_shape(_OP, "x", x, (None, weight.shape[1]), "[M, K] with the weight's K")
    check_float(_OP, "x", x)
    check_device(_OP, x=x, qweight=weight.qweight)
    if quantize_in_kernel and not act_fp8:
        raise ValueError(f"{_OP}: quantize_in_kernel needs act_fp8")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    q, s = weight.qweight, weight.scale
    if q.stride(1) != 1 or s.stride(1) != 1:
        raise ValueError(f"{_OP}: weight and scale rows must be contiguous")
    scale_n, scale_k = weight.block
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    if act_fp8 and not quantize_in_kernel:
        a, a_scale = quantize_activations_fp8(x, group=scale_k)
    else:
        a, a_scale = x, x  # a_scale: any pointer, never read
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split_k)
    if split_k > 1:
        partials = torch.empty(split_k, m, n, dtype=torch.float32, device=x.device)
        arrivals = _arrival_counters(x.device, grid[0] * grid[1])
    else:
        partials = arrivals = out  # never read
    _fp8_gemm_kernel[grid](
        a, a_scale, q, s, out, partials, arrivals, m, n, k,
        a.stride(0), a_scale.stride(0), q.stride(0), s.stride(0), out.stride(0),
        SCALE_N=scale_n, BLOCK_K=scale_k, ACT_FP8=act_fp8, QUANTIZE_A=quantize_in_kernel, BLOCK_M=block_m,
        BLOCK_N=block_n, SPLIT_K=split_k, DOT_PRECISION=precision, MIN_SCALE=_MIN_ACT_SCALE, FP8_MAX_VALUE=FP8_MAX,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


_ARRIVALS: dict[torch.device, torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # replaced counter buffers: CUDA graphs captured with them keep pointing there


def _arrival_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """One int32 per output tile, zero between calls (each tile's last program resets its own): allocated once per
    device, before any CUDA graph capture (warm-up runs every shape first), and reused by every split-K launch of
    the stream."""
    counters = _ARRIVALS.get(device)
    if counters is None or counters.numel() < tiles:
        if counters is not None:
            _OUTGROWN.append(counters)
        counters = torch.zeros(max(tiles, 1 << 14), dtype=torch.int32, device=device)
        _ARRIVALS[device] = counters
    return counters


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _quantize_act_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s, MIN_SCALE: tl.constexpr,
                             FP8_MAX_VALUE: tl.constexpr, GROUP: tl.constexpr):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        g = tl.program_id(1)
        offs = g * GROUP + tl.arange(0, GROUP)
        mask = offs < K
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), MIN_SCALE) / FP8_MAX_VALUE
        q = tl.clamp(x / scale, -FP8_MAX_VALUE, FP8_MAX_VALUE)
        tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + row * stride_s + g, scale)

    @triton.jit
    def _fp8_gemm_kernel(
        a_ptr, a_s_ptr, w_ptr, w_s_ptr, out_ptr, partial_ptr, arrival_ptr, M, N, K,
        stride_a, stride_as, stride_w, stride_ws, stride_out,
        SCALE_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT_FP8: tl.constexpr, QUANTIZE_A: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
        MIN_SCALE: tl.constexpr, FP8_MAX_VALUE: tl.constexpr,
    ):  # fmt: skip
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        m_mask = offs_m < M
        n_mask = offs_n < N
        a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_a + offs_k[None, :]
        w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_w + offs_k[:, None]
        w_s_ptrs = w_s_ptr + (offs_n // SCALE_N).to(tl.int64) * stride_ws
        k_blocks = tl.cdiv(K, BLOCK_K)
        per_split = tl.cdiv(k_blocks, SPLIT_K)
        kb_start = tl.program_id(2) * per_split
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in range(kb_start, tl.minimum(kb_start + per_split, k_blocks)):
            k_mask = offs_k + kb * BLOCK_K < K
            a = tl.load(a_ptrs + kb * BLOCK_K, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs + kb * BLOCK_K, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
            w_s = tl.load(w_s_ptrs + kb, mask=n_mask, other=0.0)
            if ACT_FP8:
                if QUANTIZE_A:
                    af = a.to(tl.float32)
                    a_s = tl.maximum(tl.max(tl.abs(af), axis=1), MIN_SCALE) / FP8_MAX_VALUE
                    a = tl.clamp(af / a_s[:, None], -FP8_MAX_VALUE, FP8_MAX_VALUE).to(w.dtype)
                else:
                    a_s = tl.load(a_s_ptr + offs_m.to(tl.int64) * stride_as + kb, mask=m_mask, other=0.0)
                acc += tl.dot(a, w) * a_s[:, None] * w_s[None, :]
            else:  # e4m3 is exact in any 16/32-bit float: the block's scale multiplies the block's fp32 products
                acc += tl.dot(a, w.to(a.dtype), input_precision=DOT_PRECISION) * w_s[None, :]
        out_mask = m_mask[:, None] & n_mask[None, :]
        out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_out + offs_n[None, :]
        if SPLIT_K == 1:
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            tile_offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
            split_stride = tl.cast(M, tl.int64) * N  # int64: split x M x N may pass 2^31 (M may be a constexpr 1)
            tl.store(partial_ptr + tl.program_id(2) * split_stride + tile_offs, acc, mask=out_mask)
            tl.debug_barrier()
            tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            if tl.atomic_add(arrival_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1:  # the tile's last program
                total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for split in range(SPLIT_K):  # split order: the same sum whichever program got here last
                    total += tl.load(partial_ptr + split * split_stride + tile_offs, mask=out_mask, other=0.0,
                                     cache_modifier=".cg")  # fmt: skip
                tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
                tl.atomic_xchg(arrival_ptr + tile, 0)

"""y = x @ W^T for a few rows, where cuBLAS leaves bandwidth unused (H100, benchmark/check_gemv_gpu.py, NOTES stops
26-27):
- one row (decode at B=1), every projection and the lm_head: programs of 2 weight rows, each K step 2048 wide, 4
  warps (the loop is not software-pipelined: num_stages changes nothing). At T=1 this beats cuBLAS on all eight
  projection shapes of the 35B-A3B and 27B models measured: 7.93 vs 10.67 us on the [2048, 4096] output projection
  (cuBLAS splits K), 59.2 vs 63.7 us on the 27B GDN in_proj, 321 vs 355 us on the 35B lm_head (3.2 vs 2.9 TB/s);
- two rows (a k=1 verify at B=1) with the same tiles where K <= 2048 or N <= 2048 (the 35B-A3B projections and
  lm_head: out projection 8.3 vs 10.8 us, in_proj 19.3 vs 19.9, lm_head 328 vs 362); the 27B shapes lose 1-5% there
  and stay on cuBLAS, as does everything at 3+ rows;
- 2-4 rows, narrow outputs: the MoE router's [264, 2048] (cuBLAS: 5 CTAs, 5.5 us; here 2.5 us).
The rules are on shapes: under tensor parallelism the shards' shapes decide (the two-row rule may then take
27B shards that were not measured).

All T rows of x in the program, fp32 accumulation, the result rounded to x.dtype once (as cuBLAS does for a bf16
output). No split-K, no atomics: bitwise repeatable. A request's logits depend on the batch it runs in (one row here,
two here or on cuBLAS, more on cuBLAS: different K steps round differently), as with cuBLAS's kernels for different
M; under greedy decoding a near-tie can therefore pick another token with and without MTP on the GPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightllm_mtp.kernels._validate import check_device, check_float, check_same_dtype, check_shape
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import next_pow2, num_sms, triton_available, use_triton

_OP = "gemv"
GEMV_MAX_ROWS = 4  # the router at T = 4: 3.5 us vs cuBLAS's 5.5
GEMV_MAX_OUT = 1024  # output columns up to which `linear` takes the GEMV for any 1..GEMV_MAX_ROWS rows
_MAX_BLOCK_N = 16
_TILE_ELEMENTS = 8192  # T_PAD x BLOCK_N x BLOCK_K products per loop step (registers of 4 warps)
_WIDE_BLOCK_N, _WIDE_BLOCK_K = 2, 2048  # 1-2 rows, wide outputs: the sweep's best or within 2.5% at one row
_TWO_ROWS_MAX_SIDE = 2048  # two rows, wide outputs: the GEMV when K or N is at most this


def gemv_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x.float() @ weight.float().t()).to(x.dtype)


def gemv_tiles(rows: int, n: int, k: int, sms: int) -> tuple[int, int, int]:
    """(T_PAD, BLOCK_N, BLOCK_K). One or two rows and an output wider than GEMV_MAX_OUT: 2 weight rows per program,
    K steps of 2048. Otherwise the fewest weight rows per program that still give every SM a program, and a K step
    of ~_TILE_ELEMENTS products."""
    t_pad = next_pow2(rows)
    if rows <= 2 and n > GEMV_MAX_OUT:
        return t_pad, _WIDE_BLOCK_N, min(_WIDE_BLOCK_K, next_pow2(k))
    block_n = _MAX_BLOCK_N
    while block_n > 1 and -(-n // block_n) < sms:
        block_n //= 2
    return t_pad, block_n, min(next_pow2(k), max(64, _TILE_ELEMENTS // (t_pad * block_n)))


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, K] @ weight [N, K]^T -> [T, N] in x.dtype: on CUDA the Triton GEMV for T <= GEMV_MAX_ROWS rows and N
    <= GEMV_MAX_OUT, for one row of 16-bit activations, or for two where K or N <= 2048 (the shapes measured);
    F.linear (cuBLAS) otherwise."""
    if use_triton(x) and x.ndim == 2 and weight.ndim == 2 and x.shape[0] > 0 and weight.stride(-1) == 1:
        t, (n, k) = x.shape[0], weight.shape
        wide = x.dtype in (torch.bfloat16, torch.float16) and (t == 1 or (t == 2 and min(n, k) <= _TWO_ROWS_MAX_SIDE))
        if (t <= GEMV_MAX_ROWS and n <= GEMV_MAX_OUT) or wide:
            return gemv_triton(x, weight)
    return F.linear(x, weight)


def gemv_triton(
    x: torch.Tensor, weight: torch.Tensor, *, tiles: tuple[int, int, int] | None = None, num_warps: int = 4
) -> torch.Tensor:
    """x [T, K] (T <= GEMV_MAX_ROWS, unit last stride) @ weight [N, K]^T (contiguous rows) -> [T, N] in x.dtype.
    tiles (T_PAD, BLOCK_N, BLOCK_K) and num_warps: the launch shape (default gemv_tiles, 4 warps), for sweeps."""
    check_shape(_OP, "x", x, (None, None), "[T, K]")
    check_shape(_OP, "weight", weight, (None, x.shape[1]), "[N, K] with x's K")
    check_float(_OP, "x", x)
    check_same_dtype(_OP, "x", x, weight=weight)
    check_device(_OP, x=x, weight=weight)
    t, k = x.shape
    n = weight.shape[0]
    if not 0 < t <= GEMV_MAX_ROWS:
        raise ValueError(f"{_OP}: x must have 1..{GEMV_MAX_ROWS} rows, got {t}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        raise ValueError(f"{_OP}: weight rows must be contiguous, got strides {tuple(weight.stride())}")
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    t_pad, block_n, block_k = tiles or gemv_tiles(t, n, k, num_sms(x.device))
    if t_pad < t:
        raise ValueError(f"{_OP}: tiles {tiles} hold {t_pad} rows, x has {t}")
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, out, t, n, k, x.stride(0), weight.stride(0), out.stride(0),
        T_PAD=t_pad, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, **pdl_args(x),
    )  # fmt: skip
    return out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _gemv_kernel(
        x_ptr, w_ptr, out_ptr, T, N, K, stride_x, stride_w, stride_out,
        T_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        pdl_wait(PDL)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_t = tl.arange(0, T_PAD)
        n_mask = offs_n < N
        t_mask = offs_t < T
        acc = tl.zeros([T_PAD, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_w + offs_k[None, :],
                        mask=n_mask[:, None] & k_mask[None, :], other=0.0)  # fmt: skip
            xs = tl.load(x_ptr + offs_t[:, None] * stride_x + offs_k[None, :], mask=t_mask[:, None] & k_mask[None, :],
                         other=0.0)  # fmt: skip
            acc += tl.sum(xs.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        out_ptrs = out_ptr + offs_t[:, None] * stride_out + offs_n[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=t_mask[:, None] & n_mask[None, :])

"""Ragged-batch causal GQA attention over a token-granular paged KV pool (page size 1).

Serves prefill, chunked prefill (cached prefix + new rows) and speculative verify blocks. On GPU, batches whose
q blocks are short (max_q_len * G <= 64: verify, decode-like rows) run the split-K kernels of decode_attention,
which spread each request's KV over many programs; longer blocks run a flash-attention kernel over q tiles."""

from __future__ import annotations

import math

import torch

from lightllm_mtp.kernels._validate import check_device, check_index, check_shape
from lightllm_mtp.kernels.attention.decode_attention import splitk_attention_triton
from lightllm_mtp.kernels.attention.paged_attention import (check_kv_scales, check_paged_attention_args,
                                                            kv_compute_dtypes)
from lightllm_mtp.kernels.triton_utils import shared_memory_per_block, triton_available, use_triton

_OP = "prefill_attention"
_SCORE_BUDGET = 1 << 24  # fp32 score elements materialised at once by the reference
_SPLITK_MAX_ROWS = 64  # q rows x query heads per KV head up to which the split-K kernels take a batch


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, Hq, D], k/v [L, Hkv, D] (fp32), q_pos [n] absolute positions -> [n, Hq, D] fp32."""
    n, hq, d = q.shape
    length, hkv, _ = k.shape
    group = hq // hkv
    qh = q.reshape(n, hkv, group, d).permute(1, 2, 0, 3)  # [Hkv, G, n, D]
    scores = torch.matmul(qh, k.permute(1, 2, 0).unsqueeze(1)) * scale  # [Hkv, G, n, L]
    future = torch.arange(length, device=q.device)[None, :] > q_pos[:, None]  # [n, L]
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    o = torch.matmul(probs, v.permute(1, 0, 2).unsqueeze(1))  # [Hkv, G, n, D]
    return o.permute(2, 0, 1, 3).reshape(n, hq, v.shape[-1])


def prefill_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    b_req_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_seq_len: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    out = torch.empty(q.shape[0], q.shape[1], v_buffer.shape[2], dtype=q.dtype, device=q.device)
    cu, seq_lens, reqs = b1_cu_q_len.tolist(), b_seq_len.tolist(), b_req_idx.tolist()
    for b, (req, length) in enumerate(zip(reqs, seq_lens)):
        start, end = cu[b], cu[b + 1]
        if end == start:
            continue
        slots = req_to_token[req, :length].long()
        k = k_buffer[slots].float() * k_scale  # an FP8 pool: stored * per-tensor scale
        v = v_buffer[slots].float() * v_scale
        first_pos = length - (end - start)
        block = max(1, _SCORE_BUDGET // (q.shape[1] * length))
        for s in range(start, end, block):  # query blocks bound the score matrix size
            e = min(end, s + block)
            q_pos = torch.arange(first_pos + s - start, first_pos + e - start, device=q.device)
            out[s:e] = _attend(q[s:e].float(), k, v, q_pos, scale).to(q.dtype)
    return out


def prefill_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    b_req_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_seq_len: torch.Tensor,
    scale: float,
    *,
    max_q_len: int | None = None,
    max_kv_len: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal GQA attention of ragged query blocks against their requests' paged KV -> o [T, Hq, Dv] in q.dtype.

    q [T, Hq, D]; k_buffer [P, Hkv, D], v_buffer [P, Hkv, Dv]; req_to_token [R, M] int32 (KV pool slot of each
    request position); b_req_idx [B]; b1_cu_q_len [B+1]; b_seq_len [B].
    Request b owns q rows b1_cu_q_len[b]:b1_cu_q_len[b+1] (q_len of them); its KV length after this forward is
    b_seq_len[b], the new rows' K/V already stored. Row j sits at position b_seq_len[b] - q_len + j and attends
    to positions 0..itself, read from k_buffer[req_to_token[b_req_idx[b], pos]]. Head h uses KV head
    h // (Hq // Hkv). Scores, softmax and the weighted sum are fp32.
    Host bounds sizing the Triton grid: max_q_len = max q_len over requests (None: computed from b1_cu_q_len, a
    host sync), max_kv_len >= every b_seq_len (None: req_to_token.shape[1]).
    An FP8 pool (float8_e4m3fn buffers, kv_cache_dtype fp8): K = stored * k_scale, V = stored * v_scale."""
    check_paged_attention_args(_OP, q, k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len)
    check_kv_scales(_OP, k_buffer, k_scale, v_scale)
    check_shape(_OP, "b1_cu_q_len", b1_cu_q_len, (b_req_idx.shape[0] + 1,), "[B+1]")
    check_index(_OP, "b1_cu_q_len", b1_cu_q_len)
    check_device(_OP, q=q, b1_cu_q_len=b1_cu_q_len)
    if use_triton(q):
        if max_q_len is None:
            max_q_len = int((b1_cu_q_len[1:] - b1_cu_q_len[:-1]).max()) if b_req_idx.shape[0] else 0
        if max_q_len * (q.shape[1] // k_buffer.shape[1]) <= _SPLITK_MAX_ROWS:
            return splitk_attention_triton(
                q, k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len, scale,
                b1_cu_q_len=b1_cu_q_len, max_q_len=max_q_len, max_kv_len=max_kv_len, k_scale=k_scale, v_scale=v_scale,
            )
        return flash_attention_triton(
            q, k_buffer, v_buffer, req_to_token, b_req_idx, b1_cu_q_len, b_seq_len, scale, max_q_len=max_q_len,
            k_scale=k_scale, v_scale=v_scale,
        )
    return prefill_attention_ref(q, k_buffer, v_buffer, req_to_token, b_req_idx, b1_cu_q_len, b_seq_len, scale,
                                 k_scale, v_scale)  # fmt: skip


def flash_attention_triton(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    b_req_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_seq_len: torch.Tensor,
    scale: float,
    *,
    max_q_len: int,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Flash-attention over q tiles (arguments validated by prefill_attention). A tile holds BLOCK_M (q row, query
    head) pairs of one request and KV head, rows major, so the G heads sharing a KV head share every K/V tile and
    short blocks fill the tile. max_q_len bounds every request's q_len (rows past it are not computed). block_m,
    block_n, num_warps, num_stages: the launch (None: the defaults below; benchmark/check_prefill_attention_gpu.py
    sweeps them at the 27B shape)."""
    t, hq, d = q.shape
    bsz, hkv, dv = b_req_idx.shape[0], k_buffer.shape[1], v_buffer.shape[2]
    group = hq // hkv
    out = torch.empty(t, hq, dv, dtype=q.dtype, device=q.device)
    if bsz == 0 or t == 0 or max_q_len <= 0:
        return out
    block_d, block_dv = max(16, triton.next_power_of_2(d)), max(16, triton.next_power_of_2(dv))
    compute_fp32, kv_fp8 = kv_compute_dtypes(q, k_buffer)
    # sm_90 builds, D=256 bf16: M=64, N=64, 8 warps ~205 registers and 160 KiB shared memory, no spills
    if block_m is None:  # 128-row tiles at head dim 256 in bf16 need ~192 KiB of shared memory (sm90: 227 KiB)
        big = max(block_d, block_dv)
        fits = big <= 256 and not compute_fp32 and num_stages <= 2 and shared_memory_per_block(q.device) >= 200 * 1024
        block_m = min(64 if big > 128 and not fits else 128, max(16, triton.next_power_of_2(max_q_len * group)))
    if block_n is None:
        block_n = 32 if compute_fp32 else 64
    grid = (triton.cdiv(max_q_len * group, block_m), bsz, hkv)
    _flash_prefill_kernel[grid](
        q, k_buffer, v_buffer, out, req_to_token, b_req_idx, b1_cu_q_len, b_seq_len,
        scale * k_scale * math.log2(math.e), v_scale,
        *q.stride(), *k_buffer.stride(), *v_buffer.stride(), req_to_token.stride(0), *out.stride(),
        G=group, D=d, DV=dv, BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_N=block_n,
        COMPUTE_FP32=compute_fp32, KV_FP8=kv_fp8,
        num_warps=num_warps or (8 if block_m * block_dv >= 128 * 128 else 4), num_stages=num_stages,
    )
    return out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.attention.paged_attention import attend_paged_range
    from lightllm_mtp.kernels.attention.splitk_tiles import load_q_tile

    @triton.jit
    def _flash_prefill_kernel(
        Q, K, V, O, req_to_token, b_req_idx, b1_cu_q_len, b_seq_len, qk_scale, v_scale,
        stride_qt, stride_qh, stride_qd, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh, stride_vd,
        stride_rt, stride_ot, stride_oh, stride_od,
        G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, COMPUTE_FP32: tl.constexpr, KV_FP8: tl.constexpr,
    ):
        tile = tl.num_programs(0) - 1 - tl.program_id(0)  # the last (longest) tiles start first
        b = tl.program_id(1)
        kvh = tl.program_id(2)
        q_start = tl.load(b1_cu_q_len + b).to(tl.int32)
        q_len = tl.load(b1_cu_q_len + b + 1).to(tl.int32) - q_start
        first = tile * BLOCK_M
        if first >= q_len * G:
            return
        prefix = tl.load(b_seq_len + b).to(tl.int32) - q_len
        # tile row m = (q row (first + m) // G, query head kvh * G + (first + m) % G); padding repeats the last q row
        offs_m = first + tl.arange(0, BLOCK_M)
        mask_m = offs_m < q_len * G
        r = tl.minimum(offs_m // G, q_len - 1)
        row = (q_start + r).to(tl.int64)
        head = kvh * G + offs_m % G
        pos = prefix + r
        offs_dv = tl.arange(0, BLOCK_DV)
        q = load_q_tile(Q, row, head, mask_m, stride_qt, stride_qh, stride_qd, D, BLOCK_D, COMPUTE_FP32)
        token_row = req_to_token + tl.load(b_req_idx + b).to(tl.int64) * stride_rt
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        # keys every row of the tile sees, in whole tiles: no masks; then the causal diagonal
        full_end = (prefix + first // G + 1) // BLOCK_N * BLOCK_N
        last_pos = prefix + tl.minimum((first + BLOCK_M - 1) // G, q_len - 1)
        m_i, l_i, acc = attend_paged_range(
            q, m_i, l_i, acc, K, V, token_row, kvh, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh, stride_vd,
            pos, 0, full_end, qk_scale, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N, False, COMPUTE_FP32, KV_FP8,
        )
        m_i, l_i, acc = attend_paged_range(
            q, m_i, l_i, acc, K, V, token_row, kvh, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh, stride_vd,
            pos, full_end, last_pos + 1, qk_scale, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N, True, COMPUTE_FP32, KV_FP8,
        )
        o = acc / l_i[:, None]
        if KV_FP8:
            o = o * v_scale
        tl.store(
            O + row[:, None] * stride_ot + head[:, None] * stride_oh + offs_dv[None, :] * stride_od,
            o.to(O.dtype.element_ty), mask=mask_m[:, None] & (offs_dv[None, :] < DV),
        )

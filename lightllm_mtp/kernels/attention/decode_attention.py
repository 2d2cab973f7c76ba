"""Single-query GQA attention per request over the paged KV pool (decode step).

The Triton path is flash-decoding (split-K): stage 1 runs one program per (request, KV head, KV split) over all
q rows x the G query heads of that KV head, so each K/V row is read once per KV head, and writes a normalised
partial output and its log-sum-exp; stage 2 merges the splits. The grid depends only on host ints (batch, heads,
max_kv_len), never on tensor values, so the launch is CUDA-graph capturable. The same kernels serve short causal
q blocks (speculative verify) through prefill_attention."""

from __future__ import annotations

import math

import torch

from lightllm_mtp.kernels._validate import check_shape
from lightllm_mtp.kernels.attention.paged_attention import (check_kv_scales, check_paged_attention_args,
                                                            kv_compute_dtypes)
from lightllm_mtp.kernels.attention.verify_attention_keys_major import KEYS_MAJOR_BLOCK_N, keys_major_num_warps
from lightllm_mtp.kernels.pdl import pdl_args
from lightllm_mtp.kernels.triton_utils import num_sms, triton_available, use_triton

_OP = "decode_attention"
_GATHER_BUDGET = 1 << 24  # fp32 K elements gathered at once by the reference


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    b_req_idx: torch.Tensor,
    b_seq_len: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    bsz, hq, d = q.shape
    hkv = k_buffer.shape[1]
    out = torch.empty(bsz, hq, v_buffer.shape[2], dtype=q.dtype, device=q.device)
    if bsz == 0:
        return out
    seq_len = b_seq_len.long()
    max_len = max(1, int(seq_len.max()))
    step = max(1, _GATHER_BUDGET // (max_len * hkv * d))
    for s in range(0, bsz, step):  # batch chunks bound the gathered KV size; padded to max_len inside
        e = min(bsz, s + step)
        valid = torch.arange(max_len, device=q.device)[None, :] < seq_len[s:e, None]  # [b, L]
        slots = req_to_token[b_req_idx[s:e].long(), :max_len].long()
        slots = torch.where(valid, slots, torch.zeros_like(slots))
        k = k_buffer[slots].float() * k_scale  # [b, L, Hkv, D] (an FP8 pool: stored * per-tensor scale)
        v = v_buffer[slots].float() * v_scale
        qh = q[s:e].float().reshape(e - s, hkv, hq // hkv, d)  # [b, Hkv, G, D]
        scores = torch.matmul(qh, k.permute(0, 2, 3, 1)) * scale  # [b, Hkv, G, L]
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        o = torch.matmul(torch.softmax(scores, dim=-1), v.permute(0, 2, 1, 3))  # [b, Hkv, G, Dv]
        out[s:e] = o.reshape(e - s, hq, -1).to(q.dtype)
    return out


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    b_req_idx: torch.Tensor,
    b_seq_len: torch.Tensor,
    scale: float,
    *,
    max_kv_len: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """One query per request -> o [B, Hq, Dv] in q.dtype.

    q [B, Hq, D]; k_buffer [P, Hkv, D], v_buffer [P, Hkv, Dv]; req_to_token [R, M] int32; b_req_idx [B];
    b_seq_len [B] (>= 1). Request b's query sits at position b_seq_len[b] - 1 (its K/V already stored) and
    attends to positions 0..b_seq_len[b]-1. Head h uses KV head h // (Hq // Hkv); fp32 softmax.
    max_kv_len: host bound on b_seq_len (default req_to_token.shape[1]); only sizes the Triton grid (the KV
    split count), so a CUDA graph captured with a bound stays valid for any b_seq_len under it.
    An FP8 pool (float8_e4m3fn buffers, kv_cache_dtype fp8): K = stored * k_scale, V = stored * v_scale."""
    check_paged_attention_args(_OP, q, k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len)
    check_shape(_OP, "b_req_idx", b_req_idx, (q.shape[0],), "[B] (one query row per request)")
    check_kv_scales(_OP, k_buffer, k_scale, v_scale)
    if use_triton(q):
        return splitk_attention_triton(
            q, k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len, scale, max_kv_len=max_kv_len, k_scale=k_scale,
            v_scale=v_scale,
        )
    return decode_attention_ref(q, k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len, scale, k_scale, v_scale)


_TARGET_PROGRAMS_PER_SM = 3  # stage-1 programs per SM (3 fit at D=256, bf16): one wave, latency hidden
_MAX_SPLITS = 256


def num_kv_splits(batch: int, kv_heads: int, max_kv_len: int, block_n: int, sms: int) -> int:
    """KV splits per (request, KV head): enough programs to give every SM ~3, never a split under two BLOCK_N
    tiles of max_kv_len. Each request then splits its own length evenly (in whole tiles) in the kernel."""
    by_occupancy = math.ceil(_TARGET_PROGRAMS_PER_SM * sms / max(1, batch * kv_heads))
    by_length = math.ceil(max(1, max_kv_len) / (2 * block_n))
    return max(1, min(by_occupancy, by_length, _MAX_SPLITS))


def splitk_attention_triton(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    b_req_idx: torch.Tensor,
    b_seq_len: torch.Tensor,
    scale: float,
    *,
    b1_cu_q_len: torch.Tensor | None = None,
    max_q_len: int = 1,
    max_kv_len: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    num_warps: int | None = None,
    head_split: int = 1,
    keys_major: bool = False,
    num_stages: int = 2,
) -> torch.Tensor:
    """Split-K causal attention of short q blocks (arguments validated by the callers). Without b1_cu_q_len, q row b
    is request b's single query (decode); with it, request b owns rows b1_cu_q_len[b]:b1_cu_q_len[b+1], at most
    max_q_len of them (a host bound: rows past it are not computed). num_splits / block_n / num_warps (stage 1)
    override the heuristics. head_split: programs per KV head, each over a share of its query heads (the same KV
    read by each, the second read mostly from L2), for q blocks whose rows x query heads overflow a 16-row tile.
    keys_major: stage 1 with the keys on the MMA's M side (verify_attention_keys_major.py), for the same q blocks.
    num_stages: stage 1's software pipelining (2: the next K/V tiles copied to shared memory during this one's math)."""
    t, hq, d = q.shape
    bsz, hkv, dv = b_req_idx.shape[0], k_buffer.shape[1], v_buffer.shape[2]
    group = hq // hkv
    if group % head_split:
        raise ValueError(f"splitk_attention: head_split {head_split} must divide the {group} query heads per KV head")
    out = torch.empty(t, hq, dv, dtype=q.dtype, device=q.device)
    if bsz == 0 or t == 0 or max_q_len <= 0:
        return out
    block_d, block_dv = max(16, triton.next_power_of_2(d)), max(16, triton.next_power_of_2(dv))
    block_m = max(16, triton.next_power_of_2(max_q_len * group // head_split))
    compute_fp32, kv_fp8 = kv_compute_dtypes(q, k_buffer)
    if block_n is None and keys_major:
        block_n = KEYS_MAJOR_BLOCK_N
    elif block_n is None:  # sm_90 builds, D=256 bf16: N=32 needs ~144 registers, 3 programs fit an SM; fp32 halves it
        block_n = (64 if max(block_d, block_dv) <= 128 else 32) // (2 if compute_fp32 else 1)
    max_kv_len = req_to_token.shape[1] if max_kv_len is None else max_kv_len
    if num_splits is None:
        num_splits = num_kv_splits(bsz, hkv, max_kv_len, block_n, num_sms(q.device))
    mid_o = torch.empty(t, hq, num_splits, dv, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(t, hq, num_splits, dtype=torch.float32, device=q.device)
    has_cu = b1_cu_q_len is not None
    cu = b1_cu_q_len if has_cu else b_seq_len  # unread placeholder for decode
    if keys_major:
        stage1, default_warps = keys_major_stage1_kernel, keys_major_num_warps(block_n, kv_fp8)
    else:
        stage1, default_warps = _splitk_stage1_kernel, 4 if block_m <= 32 else 8
    stage1[(bsz, hkv * head_split, num_splits)](
        q, k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len, cu, mid_o, mid_lse,
        scale * k_scale * math.log2(math.e), v_scale, num_splits,
        *q.stride(), *k_buffer.stride(), *v_buffer.stride(), req_to_token.stride(0),
        *mid_o.stride()[:3], *mid_lse.stride()[:2],
        G=group, HEAD_SPLIT=head_split, D=d, DV=dv, BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_DV=block_dv,
        BLOCK_N=block_n, HAS_CU=has_cu, COMPUTE_FP32=compute_fp32, KV_FP8=kv_fp8,
        num_warps=num_warps or default_warps, num_stages=num_stages, **pdl_args(q),
    )
    _splitk_stage2_kernel[(bsz, max_q_len, hq)](
        mid_o, mid_lse, out, b_seq_len, cu, num_splits,
        *mid_o.stride()[:3], *mid_lse.stride()[:2], *out.stride(),
        DV=dv, BLOCK_DV=block_dv, BLOCK_N=block_n,
        BLOCK_S=triton.next_power_of_2(num_splits), HAS_CU=has_cu, num_warps=4 if block_dv >= 256 else 2,
        **pdl_args(q),
    )
    return out


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.attention.paged_attention import attend_paged_range
    from lightllm_mtp.kernels.attention.splitk_tiles import (load_q_tile, q_block, q_tile_rows, split_len,
                                                             split_program, store_split_partial)
    from lightllm_mtp.kernels.attention.verify_attention_keys_major import keys_major_stage1_kernel
    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _splitk_stage1_kernel(
        Q, K, V, req_to_token, b_req_idx, b_seq_len, b1_cu_q_len, mid_o, mid_lse, qk_scale, v_scale, num_splits,
        stride_qt, stride_qh, stride_qd, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh, stride_vd,
        stride_rt, stride_ot, stride_oh, stride_os, stride_lt, stride_lh,
        G: tl.constexpr, HEAD_SPLIT: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, HAS_CU: tl.constexpr, COMPUTE_FP32: tl.constexpr,
        KV_FP8: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl_wait(PDL)
        b, kvh, head0, q_start, q_len, seq_len, start, end, done = split_program(
            b_seq_len, b1_cu_q_len, num_splits, HEAD_SPLIT, G, BLOCK_N, HAS_CU
        )
        if done:
            return
        row, head, pos, mask_m = q_tile_rows(q_start, q_len, head0, seq_len, G // HEAD_SPLIT, BLOCK_M)
        q = load_q_tile(Q, row, head, mask_m, stride_qt, stride_qh, stride_qd, D, BLOCK_D, COMPUTE_FP32)
        token_row = req_to_token + tl.load(b_req_idx + b).to(tl.int64) * stride_rt
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        m_i, l_i, acc = attend_paged_range(
            q, m_i, l_i, acc, K, V, token_row, kvh, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh, stride_vd,
            pos, start, end, qk_scale, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N, True, COMPUTE_FP32, KV_FP8,
        )
        store_split_partial(acc, m_i, l_i, mid_o, mid_lse, row, head, mask_m, tl.program_id(2), v_scale,
                            stride_ot, stride_oh, stride_os, stride_lt, stride_lh, DV, BLOCK_DV, KV_FP8)

    @triton.jit
    def _splitk_stage2_kernel(
        mid_o, mid_lse, O, b_seq_len, b1_cu_q_len, num_splits,
        stride_mt, stride_mh, stride_ms, stride_lt, stride_lh, stride_ot, stride_oh, stride_od,
        DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
        HAS_CU: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl_wait(PDL)
        b = tl.program_id(0)
        r = tl.program_id(1)
        h = tl.program_id(2)
        q_start, q_len = q_block(b1_cu_q_len, b, HAS_CU)
        if r >= q_len:
            return
        row = (q_start + r).to(tl.int64)
        seq_len = tl.load(b_seq_len + b).to(tl.int32)
        n_splits = tl.cdiv(seq_len, split_len(seq_len, num_splits, BLOCK_N))
        offs_s = tl.arange(0, BLOCK_S)
        lse_ptr = mid_lse + row * stride_lt + h * stride_lh
        lse = tl.load(lse_ptr + offs_s, mask=offs_s < n_splits, other=float("-inf"))
        m = tl.max(lse, 0)
        m = tl.where(m == float("-inf"), 0.0, m)
        denom = tl.sum(tl.exp2(lse - m), 0)
        offs_dv = tl.arange(0, BLOCK_DV)
        o_ptr = mid_o + row * stride_mt + h * stride_mh + offs_dv
        acc = tl.zeros([BLOCK_DV], tl.float32)
        for s in range(0, n_splits):
            w = tl.exp2(tl.load(lse_ptr + s) - m)
            acc += w * tl.load(o_ptr + s * stride_ms, mask=offs_dv < DV, other=0.0)
        out = acc / tl.where(denom > 0, denom, 1.0)
        o_out = O + row * stride_ot + h * stride_oh + offs_dv * stride_od
        tl.store(o_out, out.to(O.dtype.element_ty), mask=offs_dv < DV)

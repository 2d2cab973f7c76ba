"""The pieces of split-K attention's stage 1 that its two tile orders share (decode_attention.py: the q tile on the
MMA's M side; verify_attention_keys_major.py: the keys on it): which keys a (request, split) program owns, the q
block of a request, the q tile of one KV head's query heads, and the partial output + log-sum-exp that stage 2
merges. Tile row m is (q row m // GP, query head head0 + m % GP)."""

from __future__ import annotations

from lightllm_mtp.kernels.triton_utils import triton_available

if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def split_len(seq_len, num_splits, BLOCK_N: tl.constexpr):
        """Keys per split of a request: its length spread over the splits in whole tiles (>= one tile)."""
        return tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N), 1) * BLOCK_N

    @triton.jit
    def q_block(b1_cu_q_len, b, HAS_CU: tl.constexpr):
        """(first q row, q rows) of request b: one row per request without b1_cu_q_len (decode)."""
        if HAS_CU:
            q_start = tl.load(b1_cu_q_len + b).to(tl.int32)
            q_len = tl.load(b1_cu_q_len + b + 1).to(tl.int32) - q_start
        else:
            q_start = b
            q_len = 1
        return q_start, q_len

    @triton.jit
    def split_program(b_seq_len, b1_cu_q_len, num_splits, HEAD_SPLIT: tl.constexpr, G: tl.constexpr,
                      BLOCK_N: tl.constexpr, HAS_CU: tl.constexpr):
        """The stage-1 program's work, grid (request, KV head x HEAD_SPLIT, split): its request b, KV head, first query
        head, q block, the request's length, its keys start..end-1, and done (nothing to do: a split past the
        request's keys, or an empty q block; stage 2 never reads its partial)."""
        b = tl.program_id(0)
        kvh = tl.program_id(1) // HEAD_SPLIT
        head0 = kvh * G + (tl.program_id(1) % HEAD_SPLIT) * (G // HEAD_SPLIT)
        q_start, q_len = q_block(b1_cu_q_len, b, HAS_CU)
        seq_len = tl.load(b_seq_len + b).to(tl.int32)
        keys = split_len(seq_len, num_splits, BLOCK_N)
        start = tl.program_id(2) * keys
        end = tl.minimum(start + keys, seq_len)
        done = start >= seq_len
        if HAS_CU:
            done = done | (q_len <= 0)
        return b, kvh, head0, q_start, q_len, seq_len, start, end, done

    @triton.jit
    def q_tile_rows(q_start, q_len, head0, seq_len, GP: tl.constexpr, BLOCK_M: tl.constexpr):
        """Per tile row: its q row (int64), query head, absolute position (causal bound) and validity."""
        offs_m = tl.arange(0, BLOCK_M)
        row = (q_start + offs_m // GP).to(tl.int64)
        head = head0 + offs_m % GP
        pos = seq_len - q_len + offs_m // GP
        return row, head, pos, offs_m < q_len * GP

    @triton.jit
    def load_q_tile(Q, row, head, mask_m, stride_qt, stride_qh, stride_qd, D: tl.constexpr, BLOCK_D: tl.constexpr,
                    COMPUTE_FP32: tl.constexpr):
        """q [BLOCK_M, BLOCK_D], zero past the valid rows and D."""
        offs_d = tl.arange(0, BLOCK_D)
        q = tl.load(
            Q + row[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
            mask=mask_m[:, None] & (offs_d[None, :] < D), other=0.0,
        )
        if COMPUTE_FP32:
            q = q.to(tl.float32)
        return q

    @triton.jit
    def store_split_partial(acc, m_i, l_i, mid_o, mid_lse, row, head, mask_m, split, v_scale,
                            stride_ot, stride_oh, stride_os, stride_lt, stride_lh,
                            DV: tl.constexpr, BLOCK_DV: tl.constexpr, KV_FP8: tl.constexpr):
        """This split's normalised partial output (acc [BLOCK_M, BLOCK_DV] / l) and its log2-sum-exp per tile row.
        Rows before the split's first key (verify) saw nothing: a neutral partial (lse -inf)."""
        seen = l_i > 0
        o = acc / tl.where(seen, l_i, 1.0)[:, None]
        if KV_FP8:
            o = o * v_scale
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        offs_dv = tl.arange(0, BLOCK_DV)
        base = row * stride_ot + head * stride_oh + split * stride_os
        tl.store(mid_o + base[:, None] + offs_dv[None, :], o, mask=mask_m[:, None] & (offs_dv[None, :] < DV))
        tl.store(mid_lse + row * stride_lt + head * stride_lh + split, lse, mask=mask_m)

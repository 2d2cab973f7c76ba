"""Split-K attention's stage 1 with the keys on the MMA's M side (`splitk_attention_triton(..., keys_major=True)`).

The default stage 1 computes S = Q K^T with the q tile (rows x query heads of a KV head, padded to 16 or 32) as M:
at 3-4 verify rows x 6 heads the 32-row tile streams the KV at about half the rate of the 16-row one
(benchmark/NOTES.md, stops 39-40), and neither is a shape Hopper's wgmma takes (M >= 64 per warpgroup). Here each
KV tile K [BLOCK_N, D] gives S^T = K Q^T [BLOCK_N, R] and the output accumulates transposed, O^T += V^T P^T [DV, R]:
M is BLOCK_N, then DV, whatever R is. The online softmax runs along the key axis (axis 0), one running max / sum per
column (a tile row of the default kernel). Program grid, causal masks, FP8 scales and the partial output that
stage 2 merges are the default's."""

from __future__ import annotations

from lightllm_mtp.kernels.triton_utils import triton_available

KEYS_MAJOR_BLOCK_N = 64  # M of the S^T dot: wgmma's 64 rows per warpgroup


def keys_major_num_warps(block_n: int, kv_fp8: bool) -> int:
    """Default warps: one warpgroup per 64 keys; two for an FP8 pool, whose tiles are widened to bf16 in registers
    (sm_90 builds at D = 256: 4 warps spill there, 8 do not at 16 columns)."""
    return max(4, block_n // 16) if not kv_fp8 else max(8, block_n // 16)


if triton_available():
    import triton
    import triton.language as tl

    from lightllm_mtp.kernels.attention.splitk_tiles import (load_q_tile, q_tile_rows, split_program,
                                                             store_split_partial)
    from lightllm_mtp.kernels.pdl import pdl_wait

    @triton.jit
    def _attend_paged_range_keys_major(
        q, m_i, l_i, acc_t,  # q [BLOCK_M, BLOCK_D]; running max / sum [BLOCK_M] (log2); acc_t [BLOCK_DV, BLOCK_M]
        K, V, token_row, kvh, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh, stride_vd,
        pos, start, end, qk_scale,  # pos [BLOCK_M]: absolute position of each q tile row; keys start..end-1
        D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
        COMPUTE_FP32: tl.constexpr, KV_FP8: tl.constexpr,
    ):
        """attend_paged_range (paged_attention.py, its MASKED form) with scores and output transposed."""
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        k_base = K + kvh * stride_kh + offs_d[None, :] * stride_kd
        v_base = V + kvh * stride_vh + offs_dv[None, :] * stride_vd
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + offs_n
            mask_n = offs < end
            slot = tl.load(token_row + offs, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(k_base + slot[:, None] * stride_kp, mask=mask_n[:, None] & (offs_d[None, :] < D), other=0.0)
            v = tl.load(v_base + slot[:, None] * stride_vp, mask=mask_n[:, None] & (offs_dv[None, :] < DV), other=0.0)
            if KV_FP8:
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            if COMPUTE_FP32:
                s = tl.dot(k.to(tl.float32), tl.trans(q), input_precision="ieee")
            else:
                s = tl.dot(k, tl.trans(q))  # [BLOCK_N, BLOCK_M]
            s = s * qk_scale
            s = tl.where(mask_n[:, None] & (offs[:, None] <= pos[None, :]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a column with no key yet: its p is 0
            alpha = tl.exp2(m_i - m_new_safe)
            p = tl.exp2(s - m_new_safe[None, :])
            l_i = l_i * alpha + tl.sum(p, 0)
            if COMPUTE_FP32:
                pv = tl.dot(tl.trans(v.to(tl.float32)), p, input_precision="ieee")
            else:
                pv = tl.dot(tl.trans(v), p.to(v.dtype))  # [BLOCK_DV, BLOCK_M]
            acc_t = acc_t * alpha[None, :] + pv
            m_i = m_new
        return m_i, l_i, acc_t

    @triton.jit
    def keys_major_stage1_kernel(
        Q, K, V, req_to_token, b_req_idx, b_seq_len, b1_cu_q_len, mid_o, mid_lse, qk_scale, v_scale, num_splits,
        stride_qt, stride_qh, stride_qd, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh, stride_vd,
        stride_rt, stride_ot, stride_oh, stride_os, stride_lt, stride_lh,
        G: tl.constexpr, HEAD_SPLIT: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, HAS_CU: tl.constexpr,
        COMPUTE_FP32: tl.constexpr, KV_FP8: tl.constexpr, PDL: tl.constexpr,
    ):
        """decode_attention._splitk_stage1_kernel's arguments and outputs."""
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
        acc_t = tl.zeros([BLOCK_DV, BLOCK_M], tl.float32)
        m_i, l_i, acc_t = _attend_paged_range_keys_major(
            q, m_i, l_i, acc_t, K, V, token_row, kvh, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh,
            stride_vd, pos, start, end, qk_scale, D, DV, BLOCK_D, BLOCK_DV, BLOCK_N, COMPUTE_FP32, KV_FP8,
        )
        store_split_partial(tl.trans(acc_t), m_i, l_i, mid_o, mid_lse, row, head, mask_m, tl.program_id(2), v_scale,
                            stride_ot, stride_oh, stride_os, stride_lt, stride_lh, DV, BLOCK_DV, KV_FP8)

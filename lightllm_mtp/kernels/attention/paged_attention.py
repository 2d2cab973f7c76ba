"""The paged-attention core shared by the decode and prefill kernels: the argument checks of the public wrappers and
the online-softmax pass of a q tile over one request's keys, read through the page table (`req_to_token`)."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import (FLOAT_DTYPES, check_device, check_dtype, check_float, check_index,
                                            check_same_dtype, check_shape)
from lightllm_mtp.kernels.triton_utils import triton_available

KV_FP8_DTYPE = torch.float8_e4m3fn  # an FP8 KV pool (kv_cache_dtype fp8): per-tensor scales, K = stored * k_scale
KV_DTYPES = (*FLOAT_DTYPES, KV_FP8_DTYPE)


def kv_compute_dtypes(q: torch.Tensor, k_buffer: torch.Tensor) -> tuple[bool, bool]:
    """(compute in fp32, the pool is FP8): FP8 K/V tiles are widened to q's dtype in registers, so a 16-bit q keeps
    the 16-bit tensor-core products; an fp32 q, or a pool of another 16/32-bit dtype, computes in fp32."""
    kv_fp8 = k_buffer.dtype == KV_FP8_DTYPE
    compute_fp32 = q.dtype == torch.float32 or (not kv_fp8 and q.dtype != k_buffer.dtype)
    return compute_fp32, kv_fp8


def check_kv_scales(op: str, k_buffer: torch.Tensor, k_scale: float, v_scale: float) -> None:
    if not (k_scale > 0 and v_scale > 0):
        raise ValueError(f"{op}: k_scale / v_scale must be > 0, got {k_scale} / {v_scale}")
    if k_buffer.dtype != KV_FP8_DTYPE and (k_scale != 1.0 or v_scale != 1.0):
        raise ValueError(f"{op}: k_scale / v_scale apply to an FP8 KV pool only, the pool is {k_buffer.dtype}")


def check_paged_attention_args(
    op: str,
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    b_req_idx: torch.Tensor,
    b_seq_len: torch.Tensor,
) -> None:
    check_shape(op, "q", q, (None, None, None), "[T, Hq, D]")
    check_float(op, "q", q)
    check_shape(op, "k_buffer", k_buffer, (None, None, q.shape[2]), "[P, Hkv, D]")
    check_shape(op, "v_buffer", v_buffer, (k_buffer.shape[0], k_buffer.shape[1], None), "[P, Hkv, Dv]")
    check_same_dtype(op, "k_buffer", k_buffer, v_buffer=v_buffer)
    check_dtype(op, "k_buffer", k_buffer, KV_DTYPES)
    if k_buffer.shape[1] == 0 or q.shape[1] % k_buffer.shape[1]:
        raise ValueError(f"{op}: q heads ({q.shape[1]}) must be a multiple of k_buffer heads ({k_buffer.shape[1]})")
    check_shape(op, "req_to_token", req_to_token, (None, None), "[R, M]")
    check_index(op, "req_to_token", req_to_token)
    check_shape(op, "b_req_idx", b_req_idx, (None,), "[B]")
    check_index(op, "b_req_idx", b_req_idx)
    check_shape(op, "b_seq_len", b_seq_len, (b_req_idx.shape[0],), "[B]")
    check_index(op, "b_seq_len", b_seq_len)
    check_device(
        op, q=q, k_buffer=k_buffer, v_buffer=v_buffer, req_to_token=req_to_token, b_req_idx=b_req_idx,
        b_seq_len=b_seq_len,
    )


if triton_available():
    import triton
    import triton.language as tl

    @triton.jit
    def attend_paged_range(
        q, m_i, l_i, acc,  # q [BLOCK_M, BLOCK_D]; running max / sum [BLOCK_M] (log2 domain); acc [BLOCK_M, BLOCK_DV]
        K, V, token_row,  # token_row: req_to_token row of the request (pool slot of each position)
        kvh, stride_kp, stride_kh, stride_kd, stride_vp, stride_vh, stride_vd,
        pos, start, end, qk_scale,  # pos [BLOCK_M]: absolute position of each q row; keys start..end-1
        D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
        MASKED: tl.constexpr, COMPUTE_FP32: tl.constexpr, KV_FP8: tl.constexpr,
    ):
        """Online-softmax pass of a q tile over the keys start..end-1 of one request and KV head, rows read through
        the page table. MASKED applies the length and causal masks (a row may then see no key of a tile: guarded);
        unmasked ranges must be whole BLOCK_N tiles every row may attend to. KV_FP8: the pool's e4m3 tiles are widened
        to q's dtype (exact) after the load; their per-tensor scales are folded into qk_scale and the output."""
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_d = offs_d < D
        mask_dv = offs_dv < DV
        k_base = K + kvh * stride_kh + offs_d[None, :] * stride_kd
        v_base = V + kvh * stride_vh + offs_dv[None, :] * stride_vd
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + offs_n
            if MASKED:
                mask_n = offs < end
                slot = tl.load(token_row + offs, mask=mask_n, other=0).to(tl.int64)
                k = tl.load(k_base + slot[:, None] * stride_kp, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
                v = tl.load(v_base + slot[:, None] * stride_vp, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
            else:
                slot = tl.load(token_row + offs).to(tl.int64)
                k = tl.load(k_base + slot[:, None] * stride_kp, mask=mask_d[None, :], other=0.0)
                v = tl.load(v_base + slot[:, None] * stride_vp, mask=mask_dv[None, :], other=0.0)
            if KV_FP8:
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            if COMPUTE_FP32:
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * qk_scale
            if MASKED:
                allowed = mask_n[None, :] & (offs[None, :] <= pos[:, None])
                s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if MASKED:  # a row that has seen no key yet keeps m = -inf: shift by 0 instead (its p is 0)
                m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            else:
                m_new_safe = m_new
            alpha = tl.exp2(m_i - m_new_safe)
            p = tl.exp2(s - m_new_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if COMPUTE_FP32:
                pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        return m_i, l_i, acc

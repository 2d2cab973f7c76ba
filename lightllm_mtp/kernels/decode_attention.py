"""Single-query GQA attention per request over the paged KV pool (decode step)."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_shape
from lightllm_mtp.kernels.prefill_attention import check_paged_attention_args

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
        k = k_buffer[slots].float()  # [b, L, Hkv, D]
        v = v_buffer[slots].float()
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
) -> torch.Tensor:
    """One query per request -> o [B, Hq, Dv] in q.dtype.

    q [B, Hq, D]; k_buffer [P, Hkv, D], v_buffer [P, Hkv, Dv]; req_to_token [R, M] int32; b_req_idx [B];
    b_seq_len [B] (>= 1). Request b's query sits at position b_seq_len[b] - 1 (its K/V already stored) and
    attends to positions 0..b_seq_len[b]-1. Head h uses KV head h // (Hq // Hkv); fp32 softmax."""
    check_paged_attention_args(_OP, q, k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len)
    check_shape(_OP, "b_req_idx", b_req_idx, (q.shape[0],), "[B] (one query row per request)")
    return decode_attention_ref(q, k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len, scale)

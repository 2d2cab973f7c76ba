"""Ragged-batch causal GQA attention over a token-granular paged KV pool (page size 1).

Serves prefill, chunked prefill (cached prefix + new rows) and speculative verify blocks."""

from __future__ import annotations

import torch

from lightllm_mtp.kernels._validate import check_device, check_float, check_index, check_same_dtype, check_shape

_OP = "prefill_attention"
_SCORE_BUDGET = 1 << 24  # fp32 score elements materialised at once by the reference


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
) -> torch.Tensor:
    out = torch.empty(q.shape[0], q.shape[1], v_buffer.shape[2], dtype=q.dtype, device=q.device)
    cu, seq_lens, reqs = b1_cu_q_len.tolist(), b_seq_len.tolist(), b_req_idx.tolist()
    for b, (req, length) in enumerate(zip(reqs, seq_lens)):
        start, end = cu[b], cu[b + 1]
        if end == start:
            continue
        slots = req_to_token[req, :length].long()
        k = k_buffer[slots].float()
        v = v_buffer[slots].float()
        first_pos = length - (end - start)
        block = max(1, _SCORE_BUDGET // (q.shape[1] * length))
        for s in range(start, end, block):  # query blocks bound the score matrix size
            e = min(end, s + block)
            q_pos = torch.arange(first_pos + s - start, first_pos + e - start, device=q.device)
            out[s:e] = _attend(q[s:e].float(), k, v, q_pos, scale).to(q.dtype)
    return out


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
    check_float(op, "k_buffer", k_buffer)
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


def prefill_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    b_req_idx: torch.Tensor,
    b1_cu_q_len: torch.Tensor,
    b_seq_len: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal GQA attention of ragged query blocks against their requests' paged KV -> o [T, Hq, Dv] in q.dtype.

    q [T, Hq, D]; k_buffer [P, Hkv, D], v_buffer [P, Hkv, Dv]; req_to_token [R, M] int32 (KV pool slot of each
    request position); b_req_idx [B]; b1_cu_q_len [B+1]; b_seq_len [B].
    Request b owns q rows b1_cu_q_len[b]:b1_cu_q_len[b+1] (q_len of them); its KV length after this forward is
    b_seq_len[b], the new rows' K/V already stored. Row j sits at position b_seq_len[b] - q_len + j and attends
    to positions 0..itself, read from k_buffer[req_to_token[b_req_idx[b], pos]]. Head h uses KV head
    h // (Hq // Hkv). Scores, softmax and the weighted sum are fp32."""
    check_paged_attention_args(_OP, q, k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len)
    check_shape(_OP, "b1_cu_q_len", b1_cu_q_len, (b_req_idx.shape[0] + 1,), "[B+1]")
    check_index(_OP, "b1_cu_q_len", b1_cu_q_len)
    check_device(_OP, q=q, b1_cu_q_len=b1_cu_q_len)
    return prefill_attention_ref(q, k_buffer, v_buffer, req_to_token, b_req_idx, b1_cu_q_len, b_seq_len, scale)

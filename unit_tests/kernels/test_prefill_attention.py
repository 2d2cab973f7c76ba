"""Ragged paged causal GQA attention against dense per-request attention on contiguous K/V."""

import pytest
import torch

import lightllm_mtp.kernels.prefill_attention as mod
from lightllm_mtp.kernels.prefill_attention import prefill_attention

CASES = [
    # (kv lengths, new rows per request): fresh prefill, chunked prefill with cached prefix, decode-like row,
    # verify-like block
    ([9, 23, 1, 40], [9, 7, 1, 4]),
    ([5], [5]),
    ([64, 3, 17], [1, 3, 17]),
]


def _run(seq_lens, q_lens, hq, hkv, d, dtype, seed, paged_kv):
    kv = paged_kv(seq_lens, hkv, d, dtype, seed)
    torch.manual_seed(seed)
    cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), hq, d).to(dtype)
    scale = d**-0.5
    out = prefill_attention(q, kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.b_req_idx, cu, kv.b_seq_len, scale)
    return q, cu, kv, out, scale


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("hq,hkv", [(4, 1), (6, 2), (2, 2)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_dense(dtype, tol, hq, hkv, case, paged_kv, dense_attention):
    seq_lens, q_lens = CASES[case]
    d = 32
    q, cu, kv, out, scale = _run(seq_lens, q_lens, hq, hkv, d, dtype, 1000 + case * 10 + hq, paged_kv)
    assert out.shape == q.shape and out.dtype == dtype
    for b in range(len(seq_lens)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        expected = dense_attention(q[rows], kv.keys[b], kv.values[b], scale)
        torch.testing.assert_close(out[rows].double(), expected, rtol=tol, atol=tol)


def test_query_blocking_and_value_dim(paged_kv, dense_attention, monkeypatch):
    monkeypatch.setattr(mod, "_SCORE_BUDGET", 64)  # forces several query blocks per request
    seq_lens, q_lens, hq, hkv, d, dv = [30, 12], [30, 5], 4, 2, 16, 8
    kv = paged_kv(seq_lens, hkv, d, torch.float32, 77, dv=dv)
    cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), hq, d)
    out = prefill_attention(q, kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.b_req_idx, cu, kv.b_seq_len, 0.3)
    assert out.shape == (q.shape[0], hq, dv)
    for b in range(2):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        expected = dense_attention(q[rows], kv.keys[b], kv.values[b], 0.3)
        torch.testing.assert_close(out[rows].double(), expected, rtol=2e-5, atol=2e-5)


def test_validation(paged_kv):
    kv = paged_kv([4, 3], 2, 8, torch.float32, 1)
    q = torch.randn(7, 4, 8)
    cu = torch.tensor([0, 4, 7], dtype=torch.int32)
    args = (kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.b_req_idx)
    with pytest.raises(ValueError, match=": b1_cu_q_len must"):
        prefill_attention(q, *args, cu[:2], kv.b_seq_len, 1.0)
    with pytest.raises(ValueError, match=": b_seq_len must"):
        prefill_attention(q, *args, cu, kv.b_seq_len[:1], 1.0)
    with pytest.raises(ValueError, match="multiple"):
        prefill_attention(torch.randn(7, 3, 8), *args, cu, kv.b_seq_len, 1.0)
    with pytest.raises(ValueError, match=": k_buffer must"):
        prefill_attention(torch.randn(7, 4, 16), *args, cu, kv.b_seq_len, 1.0)

"""Decode attention against dense attention and against prefill_attention with one row per request."""

import pytest
import torch

import lightllm_mtp.kernels.decode_attention as mod
from lightllm_mtp.kernels.decode_attention import decode_attention
from lightllm_mtp.kernels.prefill_attention import prefill_attention


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (3, 3), (4, 1)])
@pytest.mark.parametrize("seq_lens", [[1, 7, 30, 2], [50]])
def test_matches_dense(dtype, tol, hq, hkv, seq_lens, paged_kv, dense_attention):
    d = 32
    kv = paged_kv(seq_lens, hkv, d, dtype, 500 + hq + len(seq_lens))
    q = torch.randn(len(seq_lens), hq, d).to(dtype)
    out = decode_attention(q, kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.b_req_idx, kv.b_seq_len, d**-0.5)
    assert out.shape == q.shape and out.dtype == dtype
    for b in range(len(seq_lens)):
        expected = dense_attention(q[b : b + 1], kv.keys[b], kv.values[b], d**-0.5)
        torch.testing.assert_close(out[b : b + 1].double(), expected, rtol=tol, atol=tol)
    cu = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    via_prefill = prefill_attention(
        q, kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.b_req_idx, cu, kv.b_seq_len, d**-0.5
    )
    torch.testing.assert_close(out, via_prefill, rtol=tol, atol=tol)


def test_batch_chunking(paged_kv, dense_attention, monkeypatch):
    monkeypatch.setattr(mod, "_GATHER_BUDGET", 1)  # one request per chunk
    seq_lens = [4, 11, 6]
    kv = paged_kv(seq_lens, 2, 16, torch.float32, 9)
    q = torch.randn(3, 4, 16)
    out = decode_attention(q, kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.b_req_idx, kv.b_seq_len, 0.25)
    for b in range(3):
        expected = dense_attention(q[b : b + 1], kv.keys[b], kv.values[b], 0.25)
        torch.testing.assert_close(out[b : b + 1].double(), expected, rtol=2e-5, atol=2e-5)


def test_validation(paged_kv):
    kv = paged_kv([4, 3], 2, 8, torch.float32, 1)
    args = (kv.k_buffer, kv.v_buffer, kv.req_to_token)
    with pytest.raises(ValueError, match=": b_req_idx must"):
        decode_attention(torch.randn(3, 4, 8), *args, kv.b_req_idx, kv.b_seq_len, 1.0)
    with pytest.raises(ValueError, match=": req_to_token must"):
        decode_attention(torch.randn(2, 4, 8), kv.k_buffer, kv.v_buffer, kv.req_to_token.float(), kv.b_req_idx,
                         kv.b_seq_len, 1.0)

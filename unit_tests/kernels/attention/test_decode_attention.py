"""Decode attention against dense attention and against prefill_attention with one row per request; on GPU, the
Triton kernels against the reference and under CUDA-graph replay."""

import pytest
import torch

import lightllm_mtp.kernels.attention.decode_attention as mod
from lightllm_mtp.kernels.attention.decode_attention import decode_attention
from lightllm_mtp.kernels.attention.prefill_attention import prefill_attention
from lightllm_mtp.kernels.triton_utils import use_triton
from unit_tests.kernels.cuda_graphs import capture


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


def cuda_paged_kv(seq_lens, hkv, d, dtype, seed):
    """Scattered paged KV built on the GPU (the CPU builder is too slow at real sizes). Page-table entries past a
    request's length point at a junk row that would dominate any output reading it."""
    torch.manual_seed(seed)
    total = sum(seq_lens)
    k_buffer = torch.randn(total + 1, hkv, d, device="cuda").to(dtype)
    v_buffer = torch.randn(total + 1, hkv, d, device="cuda").to(dtype)
    k_buffer[total], v_buffer[total] = 30.0, 1000.0
    req_to_token = torch.full((len(seq_lens) + 3, max(seq_lens) + 5), total, dtype=torch.int32, device="cuda")
    b_req_idx = torch.randperm(req_to_token.shape[0], device="cuda")[: len(seq_lens)].to(torch.int32)
    slots = torch.randperm(total, device="cuda").to(torch.int32)
    for r, start, length in zip(b_req_idx.tolist(), [0, *torch.tensor(seq_lens).cumsum(0).tolist()], seq_lens):
        req_to_token[r, :length] = slots[start : start + length]
    b_seq_len = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    return k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len


def _require_triton(t):
    if not use_triton(t):
        pytest.skip("the Triton path is off (triton missing or LIGHTLLM_MTP_FORCE_REFERENCE_KERNELS)")


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv", [(24, 4), (16, 2)])
@pytest.mark.parametrize("bs", [1, 8, 32])
@pytest.mark.parametrize("bound", [False, True])
def test_triton_matches_reference_gpu(hq, hkv, bs, bound):
    d = 256
    gen = torch.Generator().manual_seed(bs + hq)
    seq_lens = [8192] if bs == 1 else [1, 8192, *torch.randint(1, 8193, (bs - 2,), generator=gen).tolist()]
    kv = cuda_paged_kv(seq_lens, hkv, d, torch.bfloat16, bs + hq)
    q = torch.randn(bs, hq, 2 * d, device="cuda", dtype=torch.bfloat16)[..., :d]  # strided, like a fused projection
    _require_triton(q)
    out = decode_attention(q, *kv, d**-0.5, max_kv_len=max(seq_lens) if bound else None)
    torch.testing.assert_close(out, mod.decode_attention_ref(q, *kv, d**-0.5), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_triton_cuda_graph_replay_gpu():
    hq, hkv, d, max_len = 16, 2, 256, 4096
    k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len = cuda_paged_kv([max_len] * 4, hkv, d, torch.bfloat16, 5)
    q = torch.randn(4, hq, d, device="cuda", dtype=torch.bfloat16)
    _require_triton(q)
    args = (k_buffer, v_buffer, req_to_token, b_req_idx, b_seq_len, d**-0.5)
    graph, out = capture(lambda: decode_attention(q, *args, max_kv_len=max_len))
    for lens in ([max_len] * 4, [1, 4096, 17, 300], [2048, 2, 3000, 33], [5, 6, 7, 8]):
        b_seq_len.copy_(torch.tensor(lens))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.testing.assert_close(out, mod.decode_attention_ref(q, *args), rtol=2e-2, atol=2e-2)

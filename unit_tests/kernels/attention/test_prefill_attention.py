"""Ragged paged causal GQA attention against dense per-request attention on contiguous K/V; on GPU, the Triton
kernels (flash prefill, split-K verify) against the reference and verify under CUDA-graph replay."""

import pytest
import torch

import lightllm_mtp.kernels.attention.prefill_attention as mod
from lightllm_mtp.kernels.attention.prefill_attention import prefill_attention
from lightllm_mtp.kernels.triton_utils import use_triton
from unit_tests.kernels.cuda_graphs import capture

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


def _gpu_case(seq_lens, q_lens, hq, hkv, seed, d=256):
    kv = cuda_paged_kv(seq_lens, hkv, d, torch.bfloat16, seed)
    cu = torch.tensor([0, *q_lens], device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, device="cuda", dtype=torch.bfloat16)
    if not use_triton(q):
        pytest.skip("the Triton path is off (triton missing or LIGHTLLM_MTP_FORCE_REFERENCE_KERNELS)")
    return q, kv[:4], cu, kv[4], d**-0.5


GPU_BLOCK_CASES = [
    ([1024], [1024]),  # prefill
    ([8192], [2048]),  # chunked prefill over a 6k cached prefix
    ([3000, 17, 700, 4096, 1, 2500, 64, 999], [3000, 17, 300, 96, 1, 2500, 64, 4]),  # mixed ragged extend
]


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv", [(24, 4), (16, 2)])
@pytest.mark.parametrize("case", range(len(GPU_BLOCK_CASES)))
@pytest.mark.parametrize("host_bounds", [False, True])
def test_triton_prefill_matches_reference_gpu(hq, hkv, case, host_bounds):
    seq_lens, q_lens = GPU_BLOCK_CASES[case]
    q, kv, cu, seq, scale = _gpu_case(seq_lens, q_lens, hq, hkv, 100 + case)
    bounds = dict(max_q_len=max(q_lens), max_kv_len=max(seq_lens)) if host_bounds else {}
    out = prefill_attention(q, *kv, cu, seq, scale, **bounds)
    torch.testing.assert_close(out, mod.prefill_attention_ref(q, *kv, cu, seq, scale), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv", [(24, 4), (16, 2)])
@pytest.mark.parametrize("bs", [1, 8, 32])
@pytest.mark.parametrize("q_len", [2, 4, 8])
def test_triton_verify_matches_reference_gpu(hq, hkv, bs, q_len):
    gen = torch.Generator().manual_seed(bs * 10 + q_len)
    seq_lens = [8192] if bs == 1 else [q_len, 8192, *torch.randint(q_len, 8193, (bs - 2,), generator=gen).tolist()]
    q, kv, cu, seq, scale = _gpu_case(seq_lens, [q_len] * bs, hq, hkv, bs + q_len)
    out = prefill_attention(q, *kv, cu, seq, scale, max_q_len=q_len, max_kv_len=8192)
    torch.testing.assert_close(out, mod.prefill_attention_ref(q, *kv, cu, seq, scale), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_triton_verify_cuda_graph_replay_gpu():
    q_len, max_len = 4, 4096
    q, kv, cu, seq, scale = _gpu_case([max_len] * 4, [q_len] * 4, 24, 4, 9)
    run = lambda: prefill_attention(q, *kv, cu, seq, scale, max_q_len=q_len, max_kv_len=max_len)  # noqa: E731
    graph, out = capture(run)
    for lens in ([4, 4096, 17, 300], [2048, 5, 3000, 33]):
        seq.copy_(torch.tensor(lens))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.testing.assert_close(out, mod.prefill_attention_ref(q, *kv, cu, seq, scale), rtol=2e-2, atol=2e-2)

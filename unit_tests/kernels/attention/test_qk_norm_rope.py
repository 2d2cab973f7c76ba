"""qk_norm_rope against the two passes it fuses (rmsnorm of q and k heads, then apply_partial_rope), and its checks.
The Triton kernel runs under the interpreter in unit_tests/kernels/test_triton_fused_interpret.py (check_qk_norm_rope)
and on the GPU below."""

import pytest
import torch

from lightllm_mtp.kernels.attention.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv
from lightllm_mtp.kernels.attention.rotary import apply_partial_rope, build_rope_cache
from lightllm_mtp.kernels.attention.store_kv import store_kv
from lightllm_mtp.kernels.norm.rmsnorm import rmsnorm


def _inputs(t, hq, hk, d, dtype, device="cpu", seed=0, with_v=False):
    gen = torch.Generator(device=device).manual_seed(seed)
    proj = (torch.randn(t, hq * 2 * d + 2 * hk * d, device=device, generator=gen) * 3).to(dtype)
    q = proj[:, : hq * 2 * d].view(t, hq, 2 * d)[..., :d]  # query heads interleaved with gate heads
    k = proj[:, hq * 2 * d : hq * 2 * d + hk * d].view(t, hk, d)
    qw = (torch.randn(d, device=device, generator=gen) * 0.3).to(dtype)
    kw = (torch.randn(d, device=device, generator=gen) * 0.3).to(dtype)
    if with_v:
        return q, k, proj[:, hq * 2 * d + hk * d :].view(t, hk, d), qw, kw
    return q, k, qw, kw


def test_store_kv_form_equals_norm_rope_then_store():
    q, k, v, qw, kw = _inputs(5, 3, 2, 32, torch.bfloat16, with_v=True)
    cos, sin = build_rope_cache(8, 64, 1e7)
    positions = torch.tensor([0, 5, 63, 2, 9])
    mem_index = torch.tensor([6, 1, 3, 0, 8], dtype=torch.int32)
    pools = [torch.randn(10, 2, 32).bfloat16() for _ in range(2)]
    kv = dict(k_buffer=pools[0], v_buffer=pools[1])
    ref_pools = [p.clone() for p in pools]
    q_out = qk_norm_rope_store_kv(q, k, v, qw, kw, 1e-6, positions, cos, sin, **kv, mem_index=mem_index)
    q_ref, k_ref = qk_norm_rope(q, k, qw, kw, 1e-6, positions, cos, sin)
    store_kv(*ref_pools, mem_index, k_ref, v)
    assert torch.equal(q_out, q_ref) and all(torch.equal(a, b) for a, b in zip(pools, ref_pools))
    with pytest.raises(ValueError, match="qk_norm_rope_store_kv: k must"):  # T from mem_index
        qk_norm_rope_store_kv(q, k, v, qw, kw, 1e-6, positions, cos, sin, **kv, mem_index=mem_index[:3])
    with pytest.raises(ValueError, match="qk_norm_rope_store_kv: v must"):
        qk_norm_rope_store_kv(q, k, v[:, :1], qw, kw, 1e-6, positions, cos, sin, **kv, mem_index=mem_index)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_norm_then_rope(dtype):
    q, k, qw, kw = _inputs(6, 3, 2, 32, dtype)
    cos, sin = build_rope_cache(8, 64, 1e7)
    positions = torch.tensor([0, 5, 63, 2, 2, 9])
    q_out, k_out = qk_norm_rope(q, k, qw, kw, 1e-6, positions, cos, sin)
    q_ref, k_ref = apply_partial_rope(rmsnorm(q, qw, 1e-6), rmsnorm(k, kw, 1e-6), positions, cos, sin)
    assert q_out.dtype == dtype and q_out.is_contiguous() and k_out.is_contiguous()
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


def test_validation():
    q, k, qw, kw = _inputs(4, 2, 1, 16, torch.float32)
    cos, sin = build_rope_cache(8, 16, 1e4)
    pos = torch.arange(4)
    with pytest.raises(ValueError, match=": k must"):
        qk_norm_rope(q, k[:, :, :8], qw, kw, 1e-6, pos, cos, sin)
    with pytest.raises(ValueError, match=": k_weight must"):
        qk_norm_rope(q, k, qw, kw[:8], 1e-6, pos, cos, sin)
    with pytest.raises(ValueError, match="k_weight dtype"):
        qk_norm_rope(q, k, qw, kw.half(), 1e-6, pos, cos, sin)
    with pytest.raises(ValueError, match="exceeds head dim"):
        big_cos, big_sin = build_rope_cache(32, 16, 1e4)
        qk_norm_rope(q, k, qw, kw, 1e-6, pos, big_cos, big_sin)
    with pytest.raises(ValueError, match=": positions must"):
        qk_norm_rope(q, k, qw, kw, 1e-6, pos[:3], cos, sin)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 33, 4096])
def test_triton_matches_reference_gpu(t):
    """27B attention shape: 24 query heads (interleaved with their gates), 4 KV heads of 256, rotary dim 64."""
    from lightllm_mtp.kernels.attention.qk_norm_rope import qk_norm_rope_ref, qk_norm_rope_triton

    q, k, qw, kw = _inputs(t, 24, 4, 256, torch.bfloat16, "cuda", seed=t)
    cos, sin = build_rope_cache(64, 8192, 1e7, "cuda")
    positions = torch.randint(0, 8192, (t,), device="cuda")
    q_out, k_out = qk_norm_rope_triton(q, k, qw, kw, 1e-6, positions, cos, sin)
    q_ref, k_ref = qk_norm_rope_ref(q, k, qw, kw, 1e-6, positions, cos, sin)
    # same roundings as the reference; the fp32 sum of squares may differ in its last bit (reduction order)
    torch.testing.assert_close(q_out, q_ref, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(k_out, k_ref, rtol=1.6e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4096])
def test_triton_store_kv_matches_reference_gpu(t):
    from lightllm_mtp.kernels.attention.qk_norm_rope import qk_norm_rope_store_kv_ref

    q, k, v, qw, kw = _inputs(t, 24, 4, 256, torch.bfloat16, "cuda", seed=t, with_v=True)
    cos, sin = build_rope_cache(64, 8192, 1e7, "cuda")
    positions = torch.randint(0, 8192, (t,), device="cuda")
    mem_index = torch.randperm(t + 50, device="cuda")[:t].to(torch.int32)
    pools = [torch.randn(t + 50, 4, 256, device="cuda").bfloat16() for _ in range(2)]
    kv = dict(k_buffer=pools[0], v_buffer=pools[1])
    ref_pools = [p.clone() for p in pools]
    q_out = qk_norm_rope_store_kv(q, k, v, qw, kw, 1e-6, positions, cos, sin, **kv, mem_index=mem_index)
    q_ref = qk_norm_rope_store_kv_ref(q, k, v, qw, kw, 1e-6, positions, cos, sin, *ref_pools, mem_index)
    torch.testing.assert_close(q_out, q_ref, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(pools[0], ref_pools[0], rtol=1.6e-2, atol=1e-2)
    assert torch.equal(pools[1], ref_pools[1])

"""Gated delta rule against HF torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule."""

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from lightllm_mtp.kernels.gdn.fla_prefill import prefill_chunks
from lightllm_mtp.kernels.gdn.gated_delta_rule import gated_delta_rule_decode, gated_delta_rule_prefill

TOL = {torch.float32: dict(rtol=2e-4, atol=2e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _inputs(t, nk, nv, dk, dv, dtype, gen):
    q = torch.randn(t, nk, dk, generator=gen).to(dtype)
    k = torch.randn(t, nk, dk, generator=gen).to(dtype)
    v = torch.randn(t, nv, dv, generator=gen).to(dtype)
    a = torch.randn(t, nv, generator=gen)
    g = -torch.rand(nv, generator=gen).exp() * torch.nn.functional.softplus(a)  # decay in (0, 1)
    beta = torch.rand(t, nv, generator=gen)
    return q, k, v, g, beta


def _hf(fn, q, k, v, g, beta, init):
    out, state = fn(
        q[None], k[None], v[None], g[None], beta[None], initial_state=None if init is None else init[None].clone(),
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    return out[0], state[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nk,nv,dk,dv", [(2, 4, 16, 8), (1, 3, 8, 16), (2, 2, 32, 32)])
@pytest.mark.parametrize("hf_fn", [torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule])
def test_prefill_matches_hf(dtype, nk, nv, dk, dv, hf_fn):
    gen = torch.Generator().manual_seed(nk * 100 + nv * 10 + dk)
    q_lens = [5, 1, 70, 3] if hf_fn is torch_chunk_gated_delta_rule else [5, 1, 13, 3]  # 70: crosses a chunk
    slots, has_init = [3, 0, 5, 1], [False, True, True, False]
    cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    q, k, v, g, beta = _inputs(int(cu[-1]), nk, nv, dk, dv, dtype, gen)
    ssm = torch.randn(7, nv, dk, dv, generator=gen) * 0.3
    before = ssm.clone()
    out = gated_delta_rule_prefill(
        q, k, v, g, beta, ssm, b_state_idx=torch.tensor(slots, dtype=torch.int32), b1_cu_q_len=cu,
        b_has_initial_state=torch.tensor(has_init),
    )
    assert out.dtype == dtype and out.shape == v.shape
    for b, (slot, init) in enumerate(zip(slots, has_init)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        o_ref, s_ref = _hf(hf_fn, q[rows], k[rows], v[rows], g[rows], beta[rows], before[slot] if init else None)
        torch.testing.assert_close(out[rows].float(), o_ref.float(), **TOL[dtype])
        torch.testing.assert_close(ssm[slot], s_ref, rtol=2e-4, atol=2e-4)
    untouched = [s for s in range(7) if s not in slots]
    assert torch.equal(ssm[untouched], before[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_matches_hf(dtype):
    gen = torch.Generator().manual_seed(21)
    nk, nv, dk, dv, bsz = 2, 6, 16, 8, 3
    q, k, v, g, beta = _inputs(bsz, nk, nv, dk, dv, dtype, gen)
    ssm = torch.randn(5, nv, dk, dv, generator=gen) * 0.3
    before = ssm.clone()
    slots = [4, 1, 2]
    out = gated_delta_rule_decode(q, k, v, g, beta, ssm, b_state_idx=torch.tensor(slots, dtype=torch.int64))
    for b, slot in enumerate(slots):
        o_ref, s_ref = _hf(
            torch_recurrent_gated_delta_rule, q[b : b + 1], k[b : b + 1], v[b : b + 1], g[b : b + 1],
            beta[b : b + 1], before[slot],
        )
        torch.testing.assert_close(out[b : b + 1].float(), o_ref.float(), **TOL[dtype])
        torch.testing.assert_close(ssm[slot], s_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(ssm[[0, 3]], before[[0, 3]])


@pytest.mark.parametrize("splits", [[6, 1, 5], [3, 9], [1, 1, 1]])
def test_chunked_prefill_and_decode_equal_one_prefill(splits):
    """Two requests, each prefilled in pieces (state carried) then decoded == one prefill of everything."""
    gen = torch.Generator().manual_seed(len(splits) * 31 + splits[0])
    nk, nv, dk, dv, decode_steps = 1, 2, 16, 16, 4
    total = sum(splits) + decode_steps
    seqs = [_inputs(total, nk, nv, dk, dv, torch.float32, gen) for _ in range(2)]
    slots = torch.tensor([2, 0], dtype=torch.int32)
    ref_state = torch.randn(3, nv, dk, dv, generator=gen)  # junk rows: has_initial_state=False ignores them
    cu = torch.tensor([0, total, 2 * total], dtype=torch.int32)
    joined = [torch.cat([s[i] for s in seqs]) for i in range(5)]
    full = gated_delta_rule_prefill(
        *joined, ref_state, b_state_idx=slots, b1_cu_q_len=cu, b_has_initial_state=torch.tensor([False, False])
    )
    state = torch.randn(3, nv, dk, dv, generator=gen)
    pieces, start = [], 0
    for i, n in enumerate(splits):
        chunk = [torch.cat([s[j][start : start + n] for s in seqs]) for j in range(5)]
        cu = torch.tensor([0, n, 2 * n], dtype=torch.int32)
        o = gated_delta_rule_prefill(
            *chunk, state, b_state_idx=slots, b1_cu_q_len=cu, b_has_initial_state=torch.tensor([i > 0, i > 0])
        )
        pieces.append(o.view(2, n, nv, dv))
        start += n
    for _ in range(decode_steps):
        step = [torch.stack([s[j][start] for s in seqs]) for j in range(5)]
        pieces.append(gated_delta_rule_decode(*step, state, b_state_idx=slots).view(2, 1, nv, dv))
        start += 1
    torch.testing.assert_close(torch.cat(pieces, dim=1).reshape(-1, nv, dv), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[slots.long()], ref_state[slots.long()], rtol=1e-5, atol=1e-5)


def test_validation():
    q = torch.randn(4, 2, 8)
    v = torch.randn(4, 4, 8)
    g = beta = torch.rand(4, 4)
    ssm = torch.zeros(2, 4, 8, 8)
    idx = torch.tensor([0], dtype=torch.int32)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    meta = dict(b_state_idx=idx, b1_cu_q_len=cu, b_has_initial_state=torch.tensor([False]))
    with pytest.raises(ValueError, match=": ssm_state must"):
        gated_delta_rule_prefill(q, q, v, g, beta, ssm.double(), **meta)
    with pytest.raises(ValueError, match=": ssm_state must"):
        gated_delta_rule_prefill(q, q, v, g, beta, torch.zeros(2, 4, 8, 4), **meta)
    with pytest.raises(ValueError, match=": g must"):
        gated_delta_rule_prefill(q, q, v, g.bfloat16(), beta, ssm, **meta)
    with pytest.raises(ValueError, match="multiple"):
        gated_delta_rule_prefill(q, q, torch.randn(4, 3, 8), torch.rand(4, 3), torch.rand(4, 3),
                                 torch.zeros(2, 3, 8, 8), **meta)
    with pytest.raises(ValueError, match=": b_state_idx must"):
        gated_delta_rule_decode(q, q, v, g, beta, ssm, b_state_idx=idx)


# Real Qwen3.5-27B GDN shapes: bf16 activations, fp32 state.
NK, NV, DK, DV, CONV_K = 16, 48, 128, 128, 4
CONV_DIM = 2 * NK * DK + NV * DV


def _fused_decode_setup(bsz, width, seed):
    """Weights, both state pools (bsz + 2 slots, requests at scattered slots) for the fused GDN decode on CUDA."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    weight = (torch.randn(CONV_DIM, CONV_K, device=dev, generator=gen) * 0.5).to(dt)
    conv_state = torch.randn(bsz + 2, CONV_DIM, width, device=dev, generator=gen).to(dt)
    ssm_state = torch.randn(bsz + 2, NV, DK, DV, device=dev, generator=gen) * 0.05
    A_log = torch.log(torch.empty(NV, device=dev).uniform_(1, 16, generator=gen))
    dt_bias = torch.randn(NV, device=dev, generator=gen)
    conv_idx = torch.randperm(bsz + 2, device=dev, generator=gen)[:bsz].to(torch.int32)
    ssm_idx = torch.randperm(bsz + 2, device=dev, generator=gen)[:bsz].to(torch.int32)
    return weight, conv_state, ssm_state, A_log, dt_bias, conv_idx, ssm_idx


def _fused_decode_inputs(bsz, gen):
    """(qkv, a, b) sliced out of one [B, qkv | z | b | a] projection, like the layer's split."""
    proj = torch.randn(bsz, CONV_DIM + NV * DV + 2 * NV, device="cuda", generator=gen).to(torch.bfloat16)
    qkv = proj[:, :CONV_DIM]
    b = proj[:, CONV_DIM + NV * DV : CONV_DIM + NV * DV + NV]
    a = proj[:, CONV_DIM + NV * DV + NV :]
    return qkv, a, b


GDN_OUT_TOL = dict(rtol=2e-2, atol=2e-2)
GDN_STATE_TOL = dict(rtol=1e-3, atol=1e-3)


def _assert_state_close(state, ref_state):
    """The fused path rounds its conv outputs to bf16 like the reference, but a different summation order (FMA)
    can flip one rounding of a q/k/v element by an ulp, which moves a few state entries by ~1e-3..1e-2; a real
    error moves most of them, which the mean catches."""
    torch.testing.assert_close(state, ref_state, rtol=2e-2, atol=2e-2)
    assert (state - ref_state).abs().mean().item() < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 8, 32])
@pytest.mark.parametrize("width", [CONV_K - 1, CONV_K + 1])
def test_fused_decode_triton_matches_reference_gpu(bsz, width):
    from lightllm_mtp.kernels.gdn.gated_delta_rule import (
        gated_delta_rule_decode_fused,
        gated_delta_rule_decode_fused_ref,
    )

    weight, conv_state, ssm_state, A_log, dt_bias, conv_idx, ssm_idx = _fused_decode_setup(bsz, width, bsz + width)
    ref_conv, ref_ssm = conv_state.clone(), ssm_state.clone()
    gen = torch.Generator(device="cuda").manual_seed(7)
    for _ in range(3):  # consecutive steps, states carried
        qkv, a, b = _fused_decode_inputs(bsz, gen)
        out = gated_delta_rule_decode_fused(
            qkv, weight, conv_state, a, b, ssm_state, A_log=A_log, dt_bias=dt_bias, b_conv_idx=conv_idx,
            b_ssm_idx=ssm_idx, nk=NK, dk=DK, dv=DV,
        )
        expected = gated_delta_rule_decode_fused_ref(
            qkv, weight, ref_conv, conv_idx, a, b, A_log, dt_bias, ref_ssm, ssm_idx, NK, DK, DV
        )
        assert out.shape == (bsz, NV, DV) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out, expected, **GDN_OUT_TOL)
        assert torch.equal(conv_state, ref_conv)
        _assert_state_close(ssm_state, ref_ssm)


@pytest.mark.parametrize("batch,v_heads,dv,want", [
    (1, 32, 128, 16),  # 35B-A3B at B=1: 128 programs at 32 on 132 SMs
    (1, 48, 128, 16),  # 27B at B=1: 192
    (2, 48, 128, 32),  # 384 >= 2 per SM
    (16, 32, 128, 32),  # 2048 < 16 per SM
    (32, 48, 128, 64),  # 6144
    (1, 4, 8, 8),  # tile capped at dv (the tiny checkpoints)
])  # fmt: skip
def test_decode_block_v_rule(batch, v_heads, dv, want):
    from lightllm_mtp.kernels.gdn.gated_delta_rule import decode_block_v

    assert decode_block_v(batch, v_heads, dv, sms=132) == want


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 8, 32])
def test_decode_triton_matches_reference_gpu(bsz):
    from lightllm_mtp.kernels.gdn.gated_delta_rule import gated_delta_rule_decode_ref, gated_delta_rule_decode_triton

    gen = torch.Generator(device="cuda").manual_seed(bsz)
    dev = "cuda"
    x = torch.randn(bsz, CONV_DIM, device=dev, generator=gen).to(torch.bfloat16)
    q = x[:, : NK * DK].view(bsz, NK, DK)
    k = x[:, NK * DK : 2 * NK * DK].view(bsz, NK, DK)
    v = x[:, 2 * NK * DK :].view(bsz, NV, DV)
    g = -torch.rand(bsz, NV, device=dev, generator=gen)
    beta = torch.rand(bsz, NV, device=dev, generator=gen)
    state = torch.randn(bsz + 2, NV, DK, DV, device=dev, generator=gen) * 0.05
    ref_state = state.clone()
    idx = torch.randperm(bsz + 2, device=dev, generator=gen)[:bsz]
    out = gated_delta_rule_decode_triton(q, k, v, g, beta, state, idx)
    expected = gated_delta_rule_decode_ref(q, k, v, g, beta, ref_state, idx)
    torch.testing.assert_close(out, expected, **GDN_OUT_TOL)
    torch.testing.assert_close(state, ref_state, **GDN_STATE_TOL)


@pytest.mark.gpu
def test_fused_decode_cuda_graph_gpu():
    """Capture the fused decode once, replay it on new inputs copied into the static buffers."""
    from lightllm_mtp.kernels.gdn.gated_delta_rule import (
        gated_delta_rule_decode_fused,
        gated_delta_rule_decode_fused_ref,
    )

    bsz = 8
    weight, conv_state, ssm_state, A_log, dt_bias, conv_idx, ssm_idx = _fused_decode_setup(bsz, CONV_K - 1, 3)
    gen = torch.Generator(device="cuda").manual_seed(11)
    qkv_in, a_in, b_in = _fused_decode_inputs(bsz, gen)
    static_proj = torch.empty(bsz, CONV_DIM + 2 * NV, device="cuda", dtype=torch.bfloat16)
    qkv, a, b = static_proj[:, :CONV_DIM], static_proj[:, CONV_DIM : CONV_DIM + NV], static_proj[:, CONV_DIM + NV :]
    qkv.copy_(qkv_in), a.copy_(a_in), b.copy_(b_in)

    def step():
        return gated_delta_rule_decode_fused(
            qkv, weight, conv_state, a, b, ssm_state, A_log=A_log, dt_bias=dt_bias, b_conv_idx=conv_idx,
            b_ssm_idx=ssm_idx, nk=NK, dk=DK, dv=DV,
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles the kernels (and advances the states once)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    ref_conv, ref_ssm = conv_state.clone(), ssm_state.clone()
    for _ in range(3):
        qkv_in, a_in, b_in = _fused_decode_inputs(bsz, gen)
        qkv.copy_(qkv_in), a.copy_(a_in), b.copy_(b_in)
        expected = gated_delta_rule_decode_fused_ref(
            qkv_in, weight, ref_conv, conv_idx, a_in, b_in, A_log, dt_bias, ref_ssm, ssm_idx, NK, DK, DV
        )
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, expected, **GDN_OUT_TOL)
        assert torch.equal(conv_state, ref_conv)
        _assert_state_close(ssm_state, ref_ssm)


# ---- prefill with q, k normalised ahead (causal_conv1d_prefill_qkv) and the host-made chunk table ----
def test_prefill_with_normalized_qk_equals_raw():
    gen = torch.Generator().manual_seed(5)
    nk, nv, dk, dv = 2, 4, 16, 8
    cu = torch.tensor([0, 5, 6, 76], dtype=torch.int32)
    q, k, v, g, beta = _inputs(76, nk, nv, dk, dv, torch.float32, gen)
    ssm = torch.randn(4, nv, dk, dv, generator=gen) * 0.3
    ssm2 = ssm.clone()
    meta = dict(b_state_idx=torch.tensor([3, 0, 1], dtype=torch.int32), b1_cu_q_len=cu,
                b_has_initial_state=torch.tensor([False, True, True]))  # fmt: skip
    out = gated_delta_rule_prefill(q, k, v, g, beta, ssm, **meta)
    qn, kn = (x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    chunks = prefill_chunks(cu, (5, 1, 70))
    out2 = gated_delta_rule_prefill(qn, kn, v, g, beta, ssm2, **meta, qk_normalized=True, chunks=chunks)
    torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ssm2, ssm, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="chunks were made for 2 requests"):
        gated_delta_rule_prefill(qn, kn, v, g, beta, ssm2, **meta, chunks=prefill_chunks(cu[:3], None))


def test_prefill_chunks_table():
    cu = torch.tensor([0, 70, 70, 71, 199], dtype=torch.int32)
    chunks = prefill_chunks(cu, [70, 0, 1, 128])
    assert chunks.cu_seqlens.dtype == torch.int64 and torch.equal(chunks.cu_seqlens, cu.long())
    assert chunks.chunk_indices.tolist() == [[0, 0], [0, 1], [2, 0], [3, 0], [3, 1]]
    assert prefill_chunks(cu, None).chunk_indices is None
    assert prefill_chunks(cu[:1], []).chunk_indices.shape == (0, 2)
    with pytest.raises(ValueError, match="3 host lengths"):
        prefill_chunks(cu, [70, 0, 1])


@pytest.mark.gpu
@pytest.mark.parametrize("q_lens,init", [([4096], [False]), ([1, 2, 700, 3, 1500, 64, 33], [1, 1, 0, 1, 1, 0, 1])])
def test_prefill_fla_native_gva_with_chunks_matches_reference_gpu(q_lens, init):
    """The fla path at the 27B GDN shape (16 key heads, 48 value heads, no repeated key heads), q and k normalised
    ahead, the host chunk table: against the recurrent reference on the GPU, and equal to fla deriving the table."""
    from lightllm_mtp.kernels.gdn.fla_prefill import fla_chunk_kernel
    from lightllm_mtp.kernels.gdn.gated_delta_rule import gated_delta_rule_prefill_ref

    if fla_chunk_kernel() is None:
        pytest.skip("fla-core is not installed")
    gen = torch.Generator(device="cuda").manual_seed(len(q_lens))
    dev, dt = "cuda", torch.bfloat16
    t, bsz = sum(q_lens), len(q_lens)
    cu = torch.tensor([0] + q_lens, device=dev).cumsum(0).to(torch.int32)
    qn, kn = (torch.nn.functional.normalize(torch.randn(t, NK, DK, device=dev, generator=gen), dim=-1).to(dt)
              for _ in range(2))  # fmt: skip
    v = torch.randn(t, NV, DV, device=dev, generator=gen).to(dt)
    g = -torch.rand(t, NV, device=dev, generator=gen) * 0.5
    beta = torch.rand(t, NV, device=dev, generator=gen)
    ssm = torch.randn(bsz + 2, NV, DK, DV, device=dev, generator=gen) * 0.05
    states = [ssm.clone() for _ in range(3)]
    slots = torch.randperm(bsz + 2, device=dev, generator=gen)[:bsz].to(torch.int32)
    meta = dict(b_state_idx=slots, b1_cu_q_len=cu, b_has_initial_state=torch.tensor(init, device=dev, dtype=torch.bool))
    chunks = prefill_chunks(cu, q_lens)
    out = gated_delta_rule_prefill(qn, kn, v, g, beta, states[0], **meta, qk_normalized=True, chunks=chunks)
    derived = gated_delta_rule_prefill(qn, kn, v, g, beta, states[1], **meta, qk_normalized=True)
    ref = gated_delta_rule_prefill_ref(qn, kn, v, g, beta, states[2], slots, cu, meta["b_has_initial_state"], True)
    assert torch.equal(out, derived) and torch.equal(states[0], states[1])

    def rel_err(a, b):  # bf16 chunked vs fp32 recurrent: a relative error, not elementwise (errors accumulate)
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert rel_err(out, ref) < 2e-2, rel_err(out, ref)
    assert rel_err(states[0], states[2]) < 2e-2, rel_err(states[0], states[2])

"""Gated delta rule against HF torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule."""

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from lightllm_mtp.kernels.gated_delta_rule import gated_delta_rule_decode, gated_delta_rule_prefill

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
        q, k, v, g, beta, ssm, torch.tensor(slots, dtype=torch.int32), cu, torch.tensor(has_init)
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
    out = gated_delta_rule_decode(q, k, v, g, beta, ssm, torch.tensor(slots, dtype=torch.int64))
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
    full = gated_delta_rule_prefill(*joined, ref_state, slots, cu, torch.tensor([False, False]))
    state = torch.randn(3, nv, dk, dv, generator=gen)
    pieces, start = [], 0
    for i, n in enumerate(splits):
        chunk = [torch.cat([s[j][start : start + n] for s in seqs]) for j in range(5)]
        cu = torch.tensor([0, n, 2 * n], dtype=torch.int32)
        o = gated_delta_rule_prefill(*chunk, state, slots, cu, torch.tensor([i > 0, i > 0]))
        pieces.append(o.view(2, n, nv, dv))
        start += n
    for _ in range(decode_steps):
        step = [torch.stack([s[j][start] for s in seqs]) for j in range(5)]
        pieces.append(gated_delta_rule_decode(*step, state, slots).view(2, 1, nv, dv))
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
    init = torch.tensor([False])
    with pytest.raises(ValueError, match=": ssm_state must"):
        gated_delta_rule_prefill(q, q, v, g, beta, ssm.double(), idx, cu, init)
    with pytest.raises(ValueError, match=": ssm_state must"):
        gated_delta_rule_prefill(q, q, v, g, beta, torch.zeros(2, 4, 8, 4), idx, cu, init)
    with pytest.raises(ValueError, match=": g must"):
        gated_delta_rule_prefill(q, q, v, g.bfloat16(), beta, ssm, idx, cu, init)
    with pytest.raises(ValueError, match="multiple"):
        gated_delta_rule_prefill(q, q, torch.randn(4, 3, 8), torch.rand(4, 3), torch.rand(4, 3),
                                 torch.zeros(2, 3, 8, 8), idx, cu, init)
    with pytest.raises(ValueError, match=": b_state_idx must"):
        gated_delta_rule_decode(q, q, v, g, beta, ssm, idx)

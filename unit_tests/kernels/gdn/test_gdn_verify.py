"""Speculative conv1d and per-position gated delta rule vs step-by-step references, random accept lengths."""

import pytest
import torch

from lightllm_mtp.kernels.gdn.causal_conv1d import causal_conv1d_update
from lightllm_mtp.kernels.gdn.causal_conv1d_verify import causal_conv1d_verify
from lightllm_mtp.kernels.gdn.gated_delta_rule import gated_delta_rule_decode
from lightllm_mtp.kernels.gdn.gated_delta_rule_verify import (
    gated_delta_rule_verify,
    gated_delta_rule_verify_fused_gates,
)
from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gating


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_conv_verify_matches_stepwise_updates_over_rounds(k):
    torch.manual_seed(k)
    channels, kernel, bsz, rounds = 6, 4, 3, 4
    weight = torch.randn(channels, kernel)
    wide = torch.zeros(bsz, channels, kernel - 1 + k)
    wide[:, :, : kernel - 1] = torch.randn(bsz, channels, kernel - 1)
    narrow = wide[:, :, : kernel - 1].clone()  # committed history of the step-by-step reference
    accepted = torch.ones(bsz, dtype=torch.int32)
    for _ in range(rounds):
        q_lens = torch.randint(1, k + 2, (bsz,))
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(torch.int32)
        x = torch.randn(int(cu[-1]), channels)
        out = causal_conv1d_verify(
            x, weight, wide, b_state_idx=torch.arange(bsz, dtype=torch.int32), b1_cu_q_len=cu, b_accept_len=accepted
        )
        new_accepted = torch.stack([torch.randint(1, int(q) + 1, ()) for q in q_lens]).to(torch.int32)
        for b in range(bsz):
            state = narrow[b : b + 1].clone()
            for i in range(int(q_lens[b])):
                row = int(cu[b]) + i
                first = torch.zeros(1, dtype=torch.int32)
                ref = causal_conv1d_update(x[row : row + 1], weight, state, b_state_idx=first)
                torch.testing.assert_close(out[row : row + 1], ref)
                if i + 1 == int(new_accepted[b]):
                    narrow[b] = state[0]
        accepted = new_accepted
    for b in range(bsz):  # committed window = columns [a-1, a-1+K-1)
        a = int(accepted[b])
        torch.testing.assert_close(wide[b, :, a - 1 : a - 1 + kernel - 1], narrow[b])


@pytest.mark.parametrize("k", [2, 3, 5])
def test_conv_chain_steps_append_after_the_committed_window(k):
    """A draft model's chain steps (b_write_col): after a verify block with accept length a, single-token steps
    reading column a-2+j and writing from a-1+j equal step-by-step updates from the committed window, which they
    leave untouched."""
    torch.manual_seed(k)
    channels, kernel, bsz = 6, 4, 3
    weight = torch.randn(channels, kernel)
    wide = torch.randn(bsz, channels, kernel - 2 + 2 * k)  # the draft's layout: 2k positions
    slots = torch.arange(bsz, dtype=torch.int32)
    accept = torch.tensor([1, k + 1, 2], dtype=torch.int32)
    committed = torch.stack([wide[b, :, a - 1 : a + kernel - 2] for b, a in enumerate(accept.tolist())]).clone()
    state = committed.clone()
    one = torch.arange(2, dtype=torch.int32)
    for j in range(1, k):
        x = torch.randn(bsz, channels)
        position = accept - 1 + j
        out = causal_conv1d_verify(x, weight, wide, b_state_idx=slots, b1_cu_q_len=torch.arange(bsz + 1,
                                   dtype=torch.int32), b_accept_len=position, b_write_col=position)  # fmt: skip
        ref = causal_conv1d_update(x, weight, state, b_state_idx=slots)
        torch.testing.assert_close(out, ref)
        for b, a in enumerate(accept.tolist()):
            torch.testing.assert_close(wide[b, :, a - 1 : a + kernel - 2], committed[b])  # committed kept
            torch.testing.assert_close(wide[b, :, a - 1 + j : a - 1 + j + kernel - 1], state[b])  # the new window
    with pytest.raises(ValueError, match="written from column"):
        causal_conv1d_verify(x[:1], weight, wide, b_state_idx=slots[:1], b1_cu_q_len=one,
                             b_accept_len=torch.tensor([1], dtype=torch.int32),
                             b_write_col=torch.tensor([2], dtype=torch.int32))  # fmt: skip


@pytest.mark.parametrize("k", [1, 3])
def test_gdn_verify_writes_state_after_each_position(k):
    torch.manual_seed(10 + k)
    nk, nv, dk, dv, bsz, rounds = 2, 4, 8, 8, 3, 3
    rows = k + 1
    ssm = torch.zeros(bsz * rows, nv, dk, dv)
    ssm[::rows] = torch.randn(bsz, nv, dk, dv) * 0.1
    ref_state = ssm[::rows].clone()
    base = torch.arange(bsz, dtype=torch.int32) * rows
    accepted = torch.ones(bsz, dtype=torch.int32)
    for _ in range(rounds):
        q_lens = torch.randint(1, k + 2, (bsz,))
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(torch.int32)
        t = int(cu[-1])
        q, kk = torch.randn(t, nk, dk), torch.randn(t, nk, dk)
        v = torch.randn(t, nv, dv)
        g = -torch.rand(t, nv)
        beta = torch.rand(t, nv)
        out = gated_delta_rule_verify(q, kk, v, g, beta, ssm, b_state_base=base, b1_cu_q_len=cu, b_accept_len=accepted)
        new_accepted = torch.stack([torch.randint(1, int(n) + 1, ()) for n in q_lens]).to(torch.int32)
        for b in range(bsz):
            state = ref_state[b : b + 1].clone()
            for i in range(int(q_lens[b])):
                r = int(cu[b]) + i
                o = gated_delta_rule_decode(
                    q[r : r + 1], kk[r : r + 1], v[r : r + 1], g[r : r + 1], beta[r : r + 1], state,
                    b_state_idx=torch.zeros(1, dtype=torch.int32),
                )
                torch.testing.assert_close(out[r : r + 1], o)
                torch.testing.assert_close(ssm[int(base[b]) + i], state[0])
                if i + 1 == int(new_accepted[b]):
                    ref_state[b] = state[0]
        accepted = new_accepted


def test_fused_gate_entry_equals_gating_then_verify():
    torch.manual_seed(3)
    nk, nv, dk, dv, bsz, q = 2, 4, 8, 8, 3, 3
    t = bsz * q
    qq, kk, v = torch.randn(t, nk, dk), torch.randn(t, nk, dk), torch.randn(t, nv, dv)
    a, b = torch.randn(t, nv), torch.randn(t, nv)
    A_log, dt_bias = torch.rand(nv), torch.rand(nv)
    ssm = torch.randn(bsz * q, nv, dk, dv) * 0.1
    meta = dict(b_state_base=torch.arange(bsz, dtype=torch.int32) * q, b1_cu_q_len=torch.arange(bsz + 1) * q,
                b_accept_len=torch.tensor([1, 3, 2], dtype=torch.int32))  # fmt: skip
    fused_state, plain_state = ssm.clone(), ssm.clone()
    fused = gated_delta_rule_verify_fused_gates(qq, kk, v, a, b, fused_state, A_log=A_log, dt_bias=dt_bias, **meta)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    plain = gated_delta_rule_verify(qq, kk, v, g, beta, plain_state, **meta)
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(fused_state, plain_state)
    with pytest.raises(TypeError):  # metadata is keyword-only: a misplaced index cannot pass silently
        gated_delta_rule_verify(qq, kk, v, g, beta, ssm, *meta.values())


@pytest.mark.gpu
def test_conv_verify_write_column_triton_matches_reference_gpu():
    from lightllm_mtp.kernels.gdn import causal_conv1d_verify as conv

    torch.manual_seed(0)
    k, channels, kernel, bsz = 4, 300, 4, 5
    weight = torch.randn(channels, kernel, device="cuda")
    slots = torch.randperm(bsz, device="cuda").to(torch.int32)
    for write in (True, False):
        pos = torch.randint(1, 2 * k, (bsz,), device="cuda", dtype=torch.int32)
        q = 1 if write else k + 1
        acc = pos if write else pos.clamp(max=k + 1)
        x = torch.randn(bsz * q, channels, device="cuda")
        cu = torch.arange(bsz + 1, device="cuda", dtype=torch.int32) * q
        state = torch.randn(bsz, channels, kernel - 2 + 2 * k, device="cuda")
        state2 = state.clone()
        col = pos if write else None
        ref = conv.causal_conv1d_verify_ref(x, weight, state, slots, cu, acc, col)
        out = conv._verify_triton(x, weight, state2, slots, cu, acc, q, col)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(state2, state)

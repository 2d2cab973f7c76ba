"""The Triton verify kernels (spec conv1d, per-position gated delta rule) under the Triton interpreter on CPU."""

import textwrap

import pytest
from unit_tests.triton_interpreter import run_interpreted

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.gdn import causal_conv1d_verify as conv, gated_delta_rule_verify as gdn, gdn_gating as gating
    torch.manual_seed(0)
    for k in (1, 3):
        for rnd in range(2):
            bsz, C, K, nk, nv, d = 3, 12, 4, 2, 4, 16
            q_lens = torch.randint(1, k + 2, (bsz,))
            cu = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(torch.int32)
            acc = torch.stack([torch.randint(1, k + 2, ()) for _ in range(bsz)]).to(torch.int32)
            T = int(cu[-1]); slots = torch.tensor([2, 0, 1], dtype=torch.int32)
            # x is a column slice of a wider projection output, as in the GDN layer (row stride > C)
            x, w = torch.randn(T, C + 5)[:, 2 : 2 + C], torch.randn(C, K)
            st = torch.randn(3, C, K - 1 + k)
            st2 = st.clone()
            ref = conv.causal_conv1d_verify_ref(x, w, st, slots, cu, acc)
            out = conv._verify_triton(x, w, st2, slots, cu, acc, k + 1, None)
            assert out.is_contiguous()
            torch.testing.assert_close(out, ref); torch.testing.assert_close(st2, st)
            # a draft model's chain step: one token, read at column acc - 1, written from column acc (b_write_col)
            cu1 = torch.arange(bsz + 1, dtype=torch.int32)
            x1 = torch.randn(bsz, C)
            st = torch.randn(3, C, K - 2 + 2 * k); st2 = st.clone()
            pos = acc.clamp(max=2 * k - 1)
            ref = conv.causal_conv1d_verify_ref(x1, w, st, slots, cu1, pos, pos)
            out = conv._verify_triton(x1, w, st2, slots, cu1, pos, 1, pos)
            torch.testing.assert_close(out, ref); torch.testing.assert_close(st2, st)
            rows = k + 1
            qkv = torch.randn(T, (2 * nk + nv) * d + 3)[:, : (2 * nk + nv) * d]  # views of one projection
            q, kk, v = (t.reshape(T, -1, d) for t in qkv.split([nk * d, nk * d, nv * d], dim=-1))
            g, beta = -torch.rand(T, nv), torch.rand(T, nv)
            base = slots * rows
            ss = torch.randn(3 * rows, nv, d, d) * 0.1
            ss2 = ss.clone()
            ref = gdn.gated_delta_rule_verify_ref(q, kk, v, g, beta, ss, base, cu, acc)
            out = gdn._verify_triton(q, kk, v, g, beta, ss2, base, cu, acc, k + 1)
            assert out.is_contiguous()
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ss2, ss, atol=1e-5, rtol=1e-5)
            # gates computed in the kernel from the raw a, b (column slices of the projection, as in the layer)
            ab = torch.randn(T, 2 * nv + 3)
            a, b = ab[:, :nv], ab[:, nv + 1 : 2 * nv + 1]
            A_log, dt_bias = torch.randn(nv), torch.randn(nv)
            g, beta = gating.gdn_gating_ref(a, b, A_log, dt_bias)
            ss, ss2 = torch.randn(3 * rows, nv, d, d) * 0.1, None
            ss2 = ss.clone()
            ref = gdn.gated_delta_rule_verify_ref(q, kk, v, g, beta, ss, base, cu, acc)
            out = gdn._verify_triton(q, kk, v, a, b, ss2, base, cu, acc, k + 1, A_log, dt_bias)
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ss2, ss, atol=1e-5, rtol=1e-5)
    print("OK")
    """
)


def test_verify_kernels_match_references_under_the_interpreter():
    out = run_interpreted(SCRIPT)
    assert "OK" in out, out[-3000:]

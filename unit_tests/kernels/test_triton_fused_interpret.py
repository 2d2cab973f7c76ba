"""The Triton kernels behind the kernel wrappers, run on CPU tensors by the Triton interpreter and compared with the
PyTorch references (fp32, tiny shapes).

TRITON_INTERPRET must be set before triton is first imported, so the checks run in one subprocess (this file run as
a script) that reports a result per check; the pytest cases below read those results."""

import json
import os
import sys
import traceback

import pytest
from unit_tests.triton_interpreter import run_interpreted

TOL = dict(rtol=1e-5, atol=1e-5)


def _close(actual, expected, **tol):
    import torch

    torch.testing.assert_close(actual, expected, **(tol or TOL))


def check_rmsnorm():
    import torch

    from lightllm_mtp.kernels.norm.rmsnorm import rmsnorm_ref, rmsnorm_triton

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(40, generator=gen) * 0.2
    fused = torch.randn(5, 3, 2 * 40, generator=gen) * 3
    cases = [
        torch.randn(7, 40, generator=gen),
        torch.randn(40, generator=gen),
        fused[..., :40],  # q heads of a [query | gate] projection: [T, H, D], row stride 2D
        fused.view(5, 3 * 80)[:, 40:160].view(5, 3, 40),  # [T, H, D] view that cannot be flattened to rows
        torch.randn(2, 3, 4, 40, generator=gen),
    ]
    for x in cases:
        out = rmsnorm_triton(x, w, 1e-6)
        assert out.shape == x.shape and out.is_contiguous()
        _close(out, rmsnorm_ref(x, w, 1e-6))


def check_add_rmsnorm():
    import torch

    from lightllm_mtp.kernels.norm.rmsnorm import add_rmsnorm_ref, add_rmsnorm_triton

    gen = torch.Generator().manual_seed(1)
    w = torch.randn(48, generator=gen) * 0.2
    x = torch.randn(6, 48, generator=gen)
    res = torch.randn(6, 2, 48, generator=gen)[:, 1]  # strided rows
    normed, new_res = add_rmsnorm_triton(x, res, w, 1e-5)
    normed_ref, new_res_ref = add_rmsnorm_ref(x, res, w, 1e-5)
    _close(new_res, new_res_ref, rtol=0, atol=0)
    _close(normed, normed_ref)


def check_gated_rmsnorm():
    import torch

    from lightllm_mtp.kernels.norm.gated_rmsnorm import gated_rmsnorm_ref, gated_rmsnorm_triton

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 4, 24, generator=gen) * 2
    proj = torch.randn(5, 4 * 24 + 9, generator=gen)
    z = proj[:, : 4 * 24].view(5, 4, 24)  # gate sliced out of a wider projection
    w = 1 + 0.3 * torch.randn(24, generator=gen)
    for block_h in (None, 1, 2, 8):  # heads per program: one, several with a ragged last tile, all
        _close(gated_rmsnorm_triton(x, z, w, 1e-6, block_h=block_h), gated_rmsnorm_ref(x, z, w, 1e-6))
    x3 = torch.randn(3, 40, generator=gen)  # 2-D input: one row per program tile of 1
    _close(gated_rmsnorm_triton(x3, x3.flip(0), w[:1].expand(40).contiguous(), 1e-6),
           gated_rmsnorm_ref(x3, x3.flip(0), w[:1].expand(40).contiguous(), 1e-6))


def check_silu_and_mul():
    import torch

    from lightllm_mtp.kernels.activation.silu_and_mul import silu_and_mul_ref, silu_and_mul_triton

    gen = torch.Generator().manual_seed(3)
    for x in (torch.randn(5, 2 * 24, generator=gen) * 3, torch.randn(2, 3, 2 * 40, generator=gen),
              torch.randn(4, 2 * 1500 + 6, generator=gen)[:, : 2 * 1500]):
        out = silu_and_mul_triton(x)
        assert out.shape == (*x.shape[:-1], x.shape[-1] // 2)
        _close(out, silu_and_mul_ref(x))


def check_sigmoid_gate_mul():
    import torch

    from lightllm_mtp.kernels.attention.output_gate import sigmoid_gate_mul_ref, sigmoid_gate_mul_triton

    gen = torch.Generator().manual_seed(4)
    both = torch.randn(6, 2, 40, generator=gen) * 4
    x, gate = both[:, 0], both[:, 1]
    _close(sigmoid_gate_mul_triton(x, gate), sigmoid_gate_mul_ref(x, gate))
    # [T, H, D] gate heads interleaved with query heads in one projection (read in place), o contiguous
    proj = torch.randn(5, 3, 2 * 24, generator=gen) * 4
    o, gate = torch.randn(5, 3, 24, generator=gen), proj[..., 24:]
    out = sigmoid_gate_mul_triton(o, gate)
    assert out.shape == o.shape and out.is_contiguous()
    _close(out, sigmoid_gate_mul_ref(o, gate))


def check_qk_norm_rope():
    import torch

    from lightllm_mtp.kernels.attention.qk_norm_rope import (
        qk_norm_rope_ref,
        qk_norm_rope_store_kv_ref,
        qk_norm_rope_triton,
    )
    from lightllm_mtp.kernels.attention.rotary import build_rope_cache

    gen = torch.Generator().manual_seed(8)
    t, hq, hk, d = 5, 3, 2, 24
    proj = torch.randn(t, hq * 2 * d + 2 * hk * d, generator=gen) * 3  # [q|gate per head | k | v], as the layer's
    q = proj[:, : hq * 2 * d].view(t, hq, 2 * d)[..., :d]
    k = proj[:, hq * 2 * d : hq * 2 * d + hk * d].view(t, hk, d)
    qw, kw = torch.randn(d, generator=gen) * 0.3, torch.randn(d, generator=gen) * 0.3
    positions = torch.tensor([0, 3, 63, 7, 1])
    for rotary_dim in (8, d):
        cos, sin = build_rope_cache(rotary_dim, 64, 10000.0)
        for pos in (positions, positions.to(torch.int32)):
            q_out, k_out = qk_norm_rope_triton(q, k, qw, kw, 1e-6, pos, cos, sin)
            q_ref, k_ref = qk_norm_rope_ref(q, k, qw, kw, 1e-6, positions, cos, sin)
            assert q_out.is_contiguous() and k_out.is_contiguous()
            _close(q_out, q_ref)
            _close(k_out, k_ref)
    # the store_kv form: k and v (a view of the projection) into pool slots, the rest of the pool untouched
    v = proj[:, hq * 2 * d + hk * d :].view(t, hk, d)
    mem_index = torch.tensor([7, 2, 11, 0, 5], dtype=torch.int32)
    pools = [torch.randn(12, hk, d, generator=gen) for _ in range(2)]
    ref_pools = [p.clone() for p in pools]
    q_out, none = qk_norm_rope_triton(q, k, qw, kw, 1e-6, positions, cos, sin, (v, *pools, mem_index))
    q_ref = qk_norm_rope_store_kv_ref(q, k, v, qw, kw, 1e-6, positions, cos, sin, *ref_pools, mem_index)
    assert none is None
    _close(q_out, q_ref)
    _close(pools[0], ref_pools[0])
    _close(pools[1], ref_pools[1], rtol=0, atol=0)


def check_gdn_gating():
    import torch

    from lightllm_mtp.kernels.gdn.gdn_gating import gdn_gating_ref, gdn_gating_triton

    gen = torch.Generator().manual_seed(5)
    proj = torch.randn(7, 20, generator=gen) * 8
    a, b = proj[:, :6], proj[:, 10:16]
    a[0, 0], a[1, 1], a[2, 2] = 25.0, -40.0, 19.5  # softplus linear regime, underflow, threshold
    A_log = torch.log(torch.empty(6).uniform_(0.01, 16, generator=gen))
    dt_bias = torch.randn(6, generator=gen)
    g, beta = gdn_gating_triton(a, b, A_log, dt_bias)
    g_ref, beta_ref = gdn_gating_ref(a, b, A_log, dt_bias)
    _close(g, g_ref, rtol=1e-5, atol=1e-6)
    _close(beta, beta_ref, rtol=1e-6, atol=1e-6)


def check_partial_rope():
    import torch

    from lightllm_mtp.kernels.attention.rotary import apply_partial_rope_ref, apply_partial_rope_triton, build_rope_cache

    gen = torch.Generator().manual_seed(6)
    t, hq, hk, d = 5, 3, 2, 24
    q = torch.randn(t, hq, 2 * d, generator=gen)[..., :d]  # strided heads
    k = torch.randn(t, hk, d, generator=gen)
    positions = torch.tensor([0, 3, 63, 7, 1])
    for rotary_dim in (8, d):
        cos, sin = build_rope_cache(rotary_dim, 64, 10000.0)
        for pos in (positions, positions.to(torch.int32)):
            q_out, k_out = apply_partial_rope_triton(q, k, pos, cos, sin)
            q_ref, k_ref = apply_partial_rope_ref(q, k, positions, cos, sin)
            _close(q_out, q_ref)
            _close(k_out, k_ref)


def check_causal_conv1d_update():
    import torch

    from lightllm_mtp.kernels.gdn.causal_conv1d import causal_conv1d_update_ref, causal_conv1d_update_triton

    gen = torch.Generator().manual_seed(7)
    c = 150  # > one channel block of 128, not a multiple of it
    for kw, width in ((4, 3), (4, 5), (2, 1)):
        x = torch.randn(3, c + 11, generator=gen)[:, :c]
        weight = torch.randn(c, kw, generator=gen) * 0.5
        state = torch.randn(6, c, width, generator=gen)
        ref_state = state.clone()
        idx = torch.tensor([4, 0, 2], dtype=torch.int32)
        for _ in range(2):  # the shifted state feeds the next step
            out = causal_conv1d_update_triton(x, weight, state, idx)
            _close(out, causal_conv1d_update_ref(x, weight, ref_state, idx))
            _close(state, ref_state, rtol=0, atol=0)  # other slots and columns >= K-1 untouched


def check_gated_delta_rule_decode():
    import torch

    from lightllm_mtp.kernels.gdn.gated_delta_rule import gated_delta_rule_decode_ref, gated_delta_rule_decode_triton

    gen = torch.Generator().manual_seed(8)
    bsz, nk, nv, dk, dv = 3, 2, 4, 16, 24  # dv not a power of two: masked V tiles
    qk = torch.randn(bsz, 2 * nk * dk + nv * dv, generator=gen)
    q = qk[:, : nk * dk].view(bsz, nk, dk)
    k = qk[:, nk * dk : 2 * nk * dk].view(bsz, nk, dk)
    v = qk[:, 2 * nk * dk :].view(bsz, nv, dv)
    g = -torch.rand(bsz, nv, generator=gen)
    beta = torch.rand(bsz, nv, generator=gen)
    idx = torch.tensor([5, 1, 2], dtype=torch.int64)
    for block_v in (None, 16):
        state = torch.randn(6, nv, dk, dv, generator=gen) * 0.3
        ref_state = state.clone()
        out = gated_delta_rule_decode_triton(q, k, v, g, beta, state, idx, block_v=block_v)
        _close(out, gated_delta_rule_decode_ref(q, k, v, g, beta, ref_state, idx))
        _close(state, ref_state)


def check_gated_delta_rule_decode_fused():
    import torch

    from lightllm_mtp.kernels.gdn.gated_delta_rule import (
        gated_delta_rule_decode_fused_ref,
        gated_delta_rule_decode_fused_triton,
    )

    gen = torch.Generator().manual_seed(9)
    bsz, nk, nv, dk, dv, kw = 3, 2, 4, 16, 16, 4
    conv_dim = 2 * nk * dk + nv * dv
    for width in (kw - 1, kw + 1):
        weight = torch.randn(conv_dim, kw, generator=gen) * 0.5
        conv_state = torch.randn(5, conv_dim, width, generator=gen)
        ssm_state = torch.randn(6, nv, dk, dv, generator=gen) * 0.3
        ref_conv, ref_ssm = conv_state.clone(), ssm_state.clone()
        A_log = torch.log(torch.empty(nv).uniform_(0.5, 8, generator=gen))
        dt_bias = torch.randn(nv, generator=gen)
        conv_idx = torch.tensor([3, 0, 4], dtype=torch.int32)
        ssm_idx = torch.tensor([5, 1, 2], dtype=torch.int64)
        for _ in range(3):  # consecutive decode steps, both states carried
            proj = torch.randn(bsz, conv_dim + nv * dv + 2 * nv, generator=gen)  # [qkv | z | b | a] like the layer
            qkv = proj[:, :conv_dim]
            b = proj[:, conv_dim + nv * dv : conv_dim + nv * dv + nv]
            a = proj[:, conv_dim + nv * dv + nv :]
            args = (weight, conv_state, conv_idx, a, b, A_log, dt_bias, ssm_state, ssm_idx, nk, dk, dv)
            ref_args = (weight, ref_conv, conv_idx, a, b, A_log, dt_bias, ref_ssm, ssm_idx, nk, dk, dv)
            out = gated_delta_rule_decode_fused_triton(qkv, *args)
            expected = gated_delta_rule_decode_fused_ref(qkv, *ref_args)
            assert out.shape == (bsz, nv, dv) and out.dtype == qkv.dtype
            _close(out, expected)
            _close(conv_state, ref_conv, rtol=0, atol=0)
            _close(ssm_state, ref_ssm)


CHECKS = {name[len("check_") :]: fn for name, fn in dict(globals()).items() if name.startswith("check_")}


def _run_all() -> dict:
    import torch

    torch.set_num_threads(1)
    import triton  # noqa: F401  (imported here, after TRITON_INTERPRET is set)

    from lightllm_mtp.kernels.norm.rmsnorm import _rmsnorm_kernel

    results = {}
    if type(_rmsnorm_kernel).__name__ != "InterpretedFunction":
        return {name: "the Triton interpreter is not active" for name in CHECKS}
    for name, fn in CHECKS.items():
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    return results


@pytest.fixture(scope="module")
def interpreter_results():
    pytest.importorskip("triton")
    return json.loads(run_interpreted(file=__file__).strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_triton_kernel_under_interpreter(interpreter_results, name):
    assert interpreter_results[name] == "ok", interpreter_results[name]


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    print(json.dumps(_run_all()))

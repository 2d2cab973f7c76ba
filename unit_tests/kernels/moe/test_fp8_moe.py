"""Routed and shared experts with block-FP8 weights (kernels/moe/fp8_moe.py), w8a8: the expert-major pass's FP8
kernels against the w8a8 reference under Triton's interpreter; the reference against the dequantized experts within
the e4m3 rounding of the activations; the wrappers' checks; on the GPU at 35B-A3B dims."""

import textwrap

import pytest
import torch

from lightllm_mtp.kernels.moe.moe_expert_pass import expert_pass_ref
from lightllm_mtp.kernels.moe.moe_routing import route_topk
from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
from lightllm_mtp.kernels.moe.fp8_moe import fp8_fused_moe, fp8_fused_moe_shared, fp8_moe_ref
from unit_tests.triton_interpreter import run_interpreted

INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.moe import moe_expert_pass as p
    from lightllm_mtp.kernels.moe.moe_routing import route_topk_ref
    from lightllm_mtp.kernels.moe import fp8_moe
    from lightllm_mtp.kernels.quant.fp8_block import quantize_fp8_block
    from lightllm_mtp.kernels.quant.fp8_gemm import quantize_activations_fp8
    from lightllm_mtp.kernels.moe.fp8_moe import PREFILL_TILES, fp8_moe_ref
    # the interpreter's fp32 -> e4m3 cast rounds a value whose mantissa carries into the next power of two down a
    # binade (the GPU's is right; test_fp8_linear.py checks the quantizer against its reference elsewhere): the
    # reference rounds the activations with the kernel's quantizer here, so that the pass's products are compared
    fp8_moe.quantize_activations_ref = lambda a, group: quantize_activations_fp8(a, group=group)
    # every float buffer the pass allocates starts as NaN: a column it reads but never writes (the act past a narrow
    # shared expert's width, inside a rounding group) poisons the result instead of passing by luck
    empty = torch.empty
    torch.empty = lambda *a, **k: (lambda t: t.fill_(float("nan")) if t.is_floating_point() else t)(empty(*a, **k))
    gen = torch.Generator().manual_seed(0)
    # (T, E, k, H, I, I_shared or None, gate_up block, down block): one-block K steps, partial blocks (H 48 of
    # 32-blocks), a shared expert narrower than a rounding group of the act (I_s 16 of 32-groups), routed-only,
    # experts of more rows than a tile, gate_up and down on different K grids (the act's groups are down's). fp32 only:
    # the interpreter's fp32 -> bf16 cast truncates (the GPU's rounds to nearest), so a bf16 act would not be the
    # reference's (the GPU test covers bf16)
    cases = ((1, 8, 2, 64, 32, 32, (32, 32), (32, 32)), (40, 4, 2, 64, 32, 16, (32, 32), (32, 32)),
             (7, 6, 3, 48, 64, None, (32, 32), (32, 32)), (20, 6, 3, 64, 32, 64, (64, 32), (32, 64)),
             (9, 6, 3, 64, 64, 32, (32, 64), (64, 32)))
    for t, experts, top_k, hidden, inter, shared, block_gu, block_d in cases:
        x = torch.randn(t, hidden + 8, generator=gen)[:, 3 : 3 + hidden]  # strided rows
        w_gu = quantize_fp8_block(torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2, block_gu)
        w_d = quantize_fp8_block(torch.randn(experts, hidden, inter, generator=gen) * 0.2, block_d)
        s_gu = quantize_fp8_block(torch.randn(2 * shared, hidden, generator=gen) * 0.2, block_gu) if shared else None
        s_d = quantize_fp8_block(torch.randn(hidden, shared, generator=gen) * 0.2, block_d) if shared else None
        w, ids = route_topk_ref(torch.randn(t, experts + 1, generator=gen), num_experts=experts, top_k=top_k,
                                shared_gate=shared is not None)
        ref = fp8_moe_ref(x, w_gu, w_d, w, ids, s_gu, s_d)
        scales = (w_gu.scale, w_d.scale) + ((s_gu.scale, s_d.scale) if shared else ())
        for tiles in (p.DECODE_TILES, PREFILL_TILES):
            out = p.expert_pass_triton(x, w_gu.qweight, w_d.qweight, w, ids, s_gu.qweight if shared else None,
                                       s_d.qweight if shared else None, tiles, scales=scales,
                                       scale_blocks=(block_gu, block_d))
            # x is rounded the same way; the act is summed in another order by the kernel and the reference, so
            # now and then one act element rounds to the neighbouring e4m3 value (2^-4 of itself) and moves its
            # token's outputs by ~1e-2: most outputs equal to fp32 rounding, the whole close in L2 (a wrong scale or
            # rounding group moves nearly every output by far more)
            rel = ((out - ref).norm() / ref.norm()).item()
            tight = ((out - ref).abs() <= 1e-4 + 1e-4 * ref.abs()).float().mean().item()
            assert rel < 2e-2 and tight > 0.9, (t, block_gu, block_d, rel, tight)
    print("OK")
    """
)


def test_fp8_expert_pass_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(INTERPRET_SCRIPT, timeout=600)
    assert "OK" in out, out[-3000:]


def _case(t, experts, top_k, hidden, inter, shared, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)

    def fp8(*shape):
        return quantize_fp8_block(torch.randn(*shape, generator=gen, device=device) * 0.03, (128, 128))

    x = torch.randn(t, hidden, generator=gen, device=device)
    logits = torch.randn(t, experts + 1, generator=gen, device=device)
    return x, fp8(experts, 2 * inter, hidden), fp8(experts, hidden, inter), fp8(2 * shared, hidden), \
        fp8(hidden, shared), logits


W8A8_REL_ERROR = 2**-4


@pytest.mark.parametrize("seed", [0, 1])
def test_reference_is_the_dequantized_pass_within_the_activation_rounding(seed):
    """The w8a8 reference (the kernels' rounding) against the fp32 pass over the dequantized experts (no activation
    rounding), which is also the CPU path. Three inputs are rounded to e4m3: x into the gate and the up products, the
    act into the down product; each rounded element is off by at most 2^-4 of itself (3 mantissa bits), spread over
    [-2^-4, 2^-4], an rms of at most 2^-4 / sqrt(3). Through the products (silu's gain ~1) the three add in quadrature
    to an rms relative error of at most sqrt(3) * 2^-4 / sqrt(3) = 2^-4 of the output (measured: 0.040-0.045 at these
    dims). The error is also far above fp32 rounding: the activations are rounded."""
    x, w_gu, w_d, s_gu, s_d, logits = _case(9, 8, 2, 256, 128, 192, seed=seed)
    weights, ids = route_topk(logits, num_experts=8, top_k=2, shared_gate=True)
    routed_w, routed_ids = weights[:, :2], ids[:, :2]
    for w8a8, exact, cpu in (
        (fp8_moe_ref(x, w_gu, w_d, weights, ids, s_gu, s_d),
         expert_pass_ref(x, w_gu.dequantize(), w_d.dequantize(), weights, ids, s_gu.dequantize(), s_d.dequantize()),
         fp8_fused_moe_shared(x, w_gate_up=w_gu, w_down=w_d, shared_gate_up=s_gu, shared_down=s_d,
                              topk_weights=weights, topk_ids=ids)),
        (fp8_moe_ref(x, w_gu, w_d, routed_w, routed_ids),
         expert_pass_ref(x, w_gu.dequantize(), w_d.dequantize(), routed_w, routed_ids),
         fp8_fused_moe(x, w_gate_up=w_gu, w_down=w_d, topk_weights=routed_w, topk_ids=routed_ids)),
    ):  # fmt: skip
        rel = ((w8a8 - exact).norm() / exact.norm()).item()
        assert 2**-10 < rel < W8A8_REL_ERROR, rel
        torch.testing.assert_close(cpu, exact, rtol=1e-5, atol=1e-6)  # the CPU path: exact activations


def test_reference_rounds_each_projection_input_per_token_group():
    """One expert, one slot, weight 1: the reference equals an explicit recompute that rounds x and the act (in x's
    dtype first) per 1 x block_k group with quantize_activations_ref and multiplies by the dequantized weights."""
    from lightllm_mtp.kernels.quant.fp8_gemm import quantize_activations_ref

    def rounded(a, group):
        q, scale = quantize_activations_ref(a, group)
        return q.float() * scale.repeat_interleave(group, dim=1)[:, : a.shape[1]]

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 96, generator=gen).bfloat16()
    w_gu = quantize_fp8_block(torch.randn(1, 128, 96, generator=gen) * 0.1, (32, 32))
    w_d = quantize_fp8_block(torch.randn(1, 96, 64, generator=gen) * 0.1, (32, 64))
    ones, zeros = torch.ones(5, 1), torch.zeros(5, 1, dtype=torch.int64)
    gate_up = rounded(x, 32) @ w_gu.dequantize()[0].t()
    act = (torch.nn.functional.silu(gate_up[:, :64]) * gate_up[:, 64:]).bfloat16()
    want = (rounded(act, 64) @ w_d.dequantize()[0].t()).bfloat16()
    torch.testing.assert_close(fp8_moe_ref(x, w_gu, w_d, ones, zeros), want, rtol=0, atol=0)


def test_wrappers_check_their_weights():
    x, w_gu, w_d, s_gu, s_d, logits = _case(3, 4, 2, 128, 64, 64)
    weights, ids = route_topk(logits, num_experts=4, top_k=2, shared_gate=True)
    with pytest.raises(ValueError, match="stacked"):
        fp8_fused_moe(x, w_gate_up=w_gu.qweight, w_down=w_d, topk_weights=weights, topk_ids=ids)
    with pytest.raises(ValueError, match="do not fit"):
        fp8_fused_moe(x, w_gate_up=w_gu, w_down=w_gu, topk_weights=weights, topk_ids=ids)
    with pytest.raises(ValueError, match="shared weights"):
        fp8_fused_moe_shared(x, w_gate_up=w_gu, w_down=w_d, shared_gate_up=s_d, shared_down=s_d,
                             topk_weights=weights, topk_ids=ids)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 64, 128, 2048])
def test_fp8_experts_gpu_35b_a3b(t):
    """35B-A3B dims (256 experts, top-8, H 2048, I 512, shared 512) in bf16 activations: decode / verify sizes take
    the decode tiles, 2048 rows the prefill tiles. The act is computed in fp32 in a different order by the kernel and
    the reference, so a few of its elements round to bf16 differently and then to the neighbouring e4m3 value (a 2^-4
    step of that element): measured on the H200, 44 of 4.2M outputs off by up to 0.039 at 2048 rows, the rest within
    bf16 rounding. So: the relative L2 error small, and at most 1e-4 of the outputs beyond 2e-2."""
    x, w_gu, w_d, s_gu, s_d, logits = _case(t, 256, 8, 2048, 512, 512, device="cuda", seed=t)
    x = x.bfloat16()
    weights, ids = route_topk(logits, num_experts=256, top_k=8, shared_gate=True)
    out = fp8_fused_moe_shared(x, w_gate_up=w_gu, w_down=w_d, shared_gate_up=s_gu, shared_down=s_d,
                               topk_weights=weights, topk_ids=ids)  # fmt: skip
    ref = fp8_moe_ref(x, w_gu, w_d, weights, ids, s_gu, s_d)  # bf16 x: the act rounded to bf16 as the kernel stores it
    _close_up_to_rounding_flips(out, ref)
    routed = fp8_fused_moe(x, w_gate_up=w_gu, w_down=w_d, topk_weights=weights[:, :8], topk_ids=ids[:, :8])
    _close_up_to_rounding_flips(routed, fp8_moe_ref(x, w_gu, w_d, weights[:, :8], ids[:, :8]))


def _close_up_to_rounding_flips(got, want):
    got, want = got.float(), want.float()
    assert ((got - want).norm() / want.norm()).item() < 1e-2
    off = ((got - want).abs() > 2e-2 + 2e-2 * want.abs()).float().mean().item()
    assert off <= 1e-4, off

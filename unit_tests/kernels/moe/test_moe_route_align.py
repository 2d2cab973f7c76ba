"""route_align: routing + expert alignment in one Triton program for small steps, the same bits as route_topk +
moe_align (the two-kernel path of larger steps), against the PyTorch reference, under the interpreter and on the GPU."""

import textwrap

import pytest
import torch

from lightllm_mtp.kernels.moe.moe_align import moe_align_ref
from lightllm_mtp.kernels.moe.moe_route_align import FUSED_MAX_PAIRS, fused_fits, route_align, route_align_ref
from lightllm_mtp.kernels.moe.moe_routing import route_topk_ref
from unit_tests.triton_interpreter import run_interpreted


def test_reference_is_route_topk_then_moe_align():
    logits = torch.randn(5, 13, generator=torch.Generator().manual_seed(1))
    r = route_align(logits, num_experts=12, top_k=3, shared_gate=True, block_m=4)  # CPU: the reference
    w, i = route_topk_ref(logits, num_experts=12, top_k=3, shared_gate=True)
    s, b = moe_align_ref(i, num_experts=13, block_m=4)
    assert torch.equal(r.ids, i) and torch.equal(r.weights, w)
    assert torch.equal(r.sorted_pairs, s) and torch.equal(r.block_expert, b)


def test_fused_bound():
    assert fused_fits(1, 9, 256) and fused_fits(7, 9, 256)  # decode B <= 7 at 35B-A3B (top-8 + shared)
    assert not fused_fits(8, 9, 256)  # 72 pairs: route_topk + moe_align
    assert fused_fits(2 * 3, 9, 256) and not fused_fits(2 * 4, 9, 256)  # a k=1 verify at B = 3 / 4
    assert not fused_fits(64, 1, 512)  # [64, 512] logits tile: too wide for one program
    assert not fused_fits(1, 9, 256, max_pairs=0)
    assert FUSED_MAX_PAIRS == 64


def test_validation():
    with pytest.raises(ValueError, match="top_k"):
        route_align(torch.randn(2, 5), num_experts=4, top_k=5, shared_gate=False, block_m=16)
    with pytest.raises(ValueError, match="shared gate"):
        route_align(torch.randn(2, 4), num_experts=4, top_k=2, shared_gate=True, block_m=16)
    with pytest.raises(ValueError, match="block_m"):
        route_align(torch.randn(2, 5), num_experts=4, top_k=2, shared_gate=True, block_m=12)
    with pytest.raises(ValueError, match="router_logits must"):
        route_align(torch.randn(2, 5, 1), num_experts=4, top_k=2, shared_gate=True, block_m=16)


ROUTE_ALIGN_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.moe import moe_align as a, moe_route_align as ra, moe_routing as r
    gen = torch.Generator().manual_seed(0)
    # (T, E, k, shared, BLOCK_M): one token; 35B-A3B at 63 pairs; no shared slot and 4-row blocks (experts with
    # several blocks); slots not a power of two; 16 tokens over 4 experts (every expert in 2+ blocks)
    cases = ((1, 8, 2, True, 16), (7, 256, 8, True, 16), (5, 6, 3, False, 4), (3, 40, 5, True, 16), (16, 4, 2, True, 4))
    for t, experts, top_k, shared, bm in cases:
        logits = torch.randn(t, experts + 3, generator=gen)
        got = ra.route_align_triton(logits, num_experts=experts, top_k=top_k, shared_gate=shared, block_m=bm)
        w, i = r.route_topk_triton(logits, num_experts=experts, top_k=top_k, renormalize=True, shared_gate=shared)
        s, b = a.moe_align_triton(i, num_experts=experts + int(shared), block_m=bm)
        ref = ra.route_align_ref(logits, num_experts=experts, top_k=top_k, shared_gate=shared, block_m=bm)
        used = int((ref.block_expert >= 0).sum())
        assert torch.equal(got.ids, i) and torch.equal(got.weights, w), (got.weights - w)  # the two-kernel bits
        assert torch.equal(got.block_expert, b) and torch.equal(got.sorted_pairs[: used * bm], s[: used * bm])
        assert torch.equal(got.ids, ref.ids)
        torch.testing.assert_close(got.weights, ref.weights)
        assert torch.equal(got.block_expert, ref.block_expert), (got.block_expert, ref.block_expert)
        assert torch.equal(got.sorted_pairs[: used * bm], ref.sorted_pairs[: used * bm])
    print("OK")
    """
)


def test_route_align_kernel_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(ROUTE_ALIGN_INTERPRET_SCRIPT)
    assert "OK" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 4, 7])
def test_route_align_gpu_35b_a3b_shape(t):
    """256 experts, top-8, the shared gate column: the one-program kernel gives the two-kernel path's bits."""
    logits = torch.randn(t, 264, generator=torch.Generator().manual_seed(t)).cuda()
    fused = route_align(logits, num_experts=256, top_k=8, shared_gate=True, block_m=16)
    split = route_align(logits, num_experts=256, top_k=8, shared_gate=True, block_m=16, max_fused_pairs=0)
    ref = route_align_ref(logits.cpu(), num_experts=256, top_k=8, shared_gate=True, block_m=16)
    used = int((ref.block_expert >= 0).sum())
    assert torch.equal(fused.ids, split.ids) and torch.equal(fused.weights, split.weights)
    assert torch.equal(fused.block_expert, split.block_expert)
    assert torch.equal(fused.sorted_pairs[: used * 16], split.sorted_pairs[: used * 16])
    assert torch.equal(fused.ids.cpu(), ref.ids) and torch.equal(fused.block_expert.cpu(), ref.block_expert)
    assert torch.equal(fused.sorted_pairs.cpu()[: used * 16], ref.sorted_pairs[: used * 16])
    torch.testing.assert_close(fused.weights.cpu(), ref.weights)

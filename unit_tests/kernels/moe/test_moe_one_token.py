"""One token's MoE step with the routing inside the gate_up kernel (moe_one_token): the same bits as route_align +
the expert pass, under the interpreter (fp32, tiny) and on the GPU (bf16, 35B-A3B dims); the wrapper's checks and
its reference path on CPU."""

import textwrap

import pytest
import torch

from lightllm_mtp.kernels.moe.fused_moe import fused_moe_shared, fused_moe_shared_one_token
from lightllm_mtp.kernels.moe.moe_expert_pass import expert_pass_ref
from lightllm_mtp.kernels.moe.moe_routing import route_topk_ref
from unit_tests.triton_interpreter import run_interpreted


def _case(experts, hidden, inter, shared_inter, gen, dtype=torch.float32, device="cpu", scale=0.2):
    def randn(*shape, s=scale):
        return (torch.randn(*shape, generator=gen, device=device) * s).to(dtype)

    return dict(x=randn(1, hidden, s=1.0), logits=randn(1, experts + 3, s=1.0),
                w_gu=randn(experts, 2 * inter, hidden), w_d=randn(experts, hidden, inter),
                s_gu=randn(2 * shared_inter, hidden), s_d=randn(hidden, shared_inter))  # fmt: skip


def test_cpu_path_routes_then_runs_the_shared_pass():
    c = _case(8, 32, 16, 24, torch.Generator().manual_seed(0))
    out = fused_moe_shared_one_token(c["x"], c["logits"], c["w_gu"], c["w_d"], c["s_gu"], c["s_d"], num_experts=8,
                                     top_k=3)  # fmt: skip
    weights, ids = route_topk_ref(c["logits"], num_experts=8, top_k=3, shared_gate=True)
    torch.testing.assert_close(out, fused_moe_shared(c["x"], c["w_gu"], c["w_d"], c["s_gu"], c["s_d"], weights, ids))


def test_validation():
    c = _case(8, 32, 16, 24, torch.Generator().manual_seed(1))
    args = (c["w_gu"], c["w_d"], c["s_gu"], c["s_d"])
    with pytest.raises(ValueError, match=r"x must have shape \[1, H\]"):
        fused_moe_shared_one_token(c["x"].repeat(2, 1), c["logits"], *args, num_experts=8, top_k=3)
    with pytest.raises(ValueError, match="logit columns"):
        fused_moe_shared_one_token(c["x"], c["logits"][:, :8], *args, num_experts=8, top_k=3)
    with pytest.raises(ValueError, match="top_k"):
        fused_moe_shared_one_token(c["x"], c["logits"], *args, num_experts=8, top_k=9)
    with pytest.raises(ValueError, match="expert weights"):
        fused_moe_shared_one_token(c["x"], c["logits"], *args, num_experts=7, top_k=3)


ONE_TOKEN_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.moe.moe_expert_pass import ExpertPassTiles, expert_pass_ref, expert_pass_triton
    from lightllm_mtp.kernels.moe.moe_one_token import one_token_moe_triton
    from lightllm_mtp.kernels.moe.moe_route_align import route_align_triton
    gen = torch.Generator().manual_seed(0)
    # (E, k, H, I, I_shared): shared I above the routed I (column programs past the routed I), below it, H not a
    # multiple of the K tile, 35B-like routing (E 64 of top-8)
    for experts, top_k, hidden, inter, shared in ((16, 4, 48, 24, 40), (6, 3, 40, 32, 16), (64, 8, 136, 16, 16)):
        x = torch.randn(1, hidden, generator=gen)
        logits = torch.randn(1, experts + 1, generator=gen)
        w_gu = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2
        w_d = torch.randn(experts, hidden, inter, generator=gen) * 0.2
        s_gu = torch.randn(2 * shared, hidden, generator=gen) * 0.2
        s_d = torch.randn(hidden, shared, generator=gen) * 0.2
        for tiles in (ExpertPassTiles(), ExpertPassTiles(gate_up_block_n=16, gate_up_block_k=32, down_block_n=32)):
            out = one_token_moe_triton(x, logits, w_gu, w_d, s_gu, s_d, num_experts=experts, top_k=top_k, tiles=tiles)
            r = route_align_triton(logits, num_experts=experts, top_k=top_k, shared_gate=True, block_m=tiles.block_m)
            aligned = expert_pass_triton(x, w_gu, w_d, r.weights, r.ids, s_gu, s_d, tiles,
                                         alignment=(r.sorted_pairs, r.block_expert))
            assert torch.equal(out, aligned), (experts, tiles, (out - aligned).abs().max())
            ref = expert_pass_ref(x, w_gu, w_d, r.weights, r.ids, s_gu, s_d)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    print("OK")
    """
)


def test_one_token_kernel_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(ONE_TOKEN_INTERPRET_SCRIPT)
    assert "OK" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_token_gpu_35b_a3b(seed):
    """35B-A3B dims (256 experts, top-8, H 2048, I 512, shared I 512), bf16: bitwise the layer's route_align + expert
    pass, close to the fp32 reference, repeatable."""
    from lightllm_mtp.kernels.moe.moe_expert_pass import expert_pass_triton
    from lightllm_mtp.kernels.moe.moe_route_align import route_align

    gen = torch.Generator(device="cuda").manual_seed(seed)
    c = _case(256, 2048, 512, 512, gen, dtype=torch.bfloat16, device="cuda", scale=0.03)
    out = fused_moe_shared_one_token(c["x"], c["logits"], c["w_gu"], c["w_d"], c["s_gu"], c["s_d"], num_experts=256,
                                     top_k=8)  # fmt: skip
    r = route_align(c["logits"], num_experts=256, top_k=8, shared_gate=True, block_m=16)
    aligned = expert_pass_triton(c["x"], c["w_gu"], c["w_d"], r.weights, r.ids, c["s_gu"], c["s_d"],
                                 alignment=(r.sorted_pairs, r.block_expert))  # fmt: skip
    assert torch.equal(out, aligned)
    ref = expert_pass_ref(c["x"], c["w_gu"], c["w_d"], r.weights, r.ids, c["s_gu"], c["s_d"])
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(out, fused_moe_shared_one_token(c["x"], c["logits"], c["w_gu"], c["w_d"], c["s_gu"], c["s_d"],
                                                       num_experts=256, top_k=8))  # fmt: skip

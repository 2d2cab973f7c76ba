"""The expert-major MoE pass (routed experts + the shared expert as expert E) against HF's sparse MoE block, and its
Triton kernels against the reference under the interpreter (fp32, tiny) and on the GPU (bf16, 35B-A3B dims)."""

import textwrap

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

from lightllm_mtp.kernels.moe.fused_moe import fused_moe, fused_moe_ref, fused_moe_shared
from lightllm_mtp.kernels.moe.moe_expert_pass import expert_pass_ref, expert_pass_triton
from lightllm_mtp.kernels.moe.moe_routing import route_topk, stack_router
from unit_tests.triton_interpreter import run_interpreted


@pytest.mark.parametrize("experts,top_k,t,inter,shared_inter", [(8, 2, 11, 16, 24), (6, 3, 1, 8, 8)])
def test_shared_pass_matches_hf_block(experts, top_k, t, inter, shared_inter):
    torch.manual_seed(t + experts)
    hidden = 32
    cfg = Qwen3_5MoeTextConfig(hidden_size=hidden, num_experts=experts, num_experts_per_tok=top_k,
                               moe_intermediate_size=inter, shared_expert_intermediate_size=shared_inter)  # fmt: skip
    block = Qwen3_5MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    x = torch.randn(1, t, hidden)
    with torch.no_grad():
        expected = block(x)[0]
    sh = block.shared_expert
    router = stack_router(block.gate.weight.detach(), block.shared_expert_gate.weight.detach())
    weights, ids = route_topk(F.linear(x[0], router), num_experts=experts, top_k=top_k, shared_gate=True)
    shared_gate_up = torch.cat([sh.gate_proj.weight, sh.up_proj.weight]).detach()
    out = fused_moe_shared(x[0], block.experts.gate_up_proj.detach(), block.experts.down_proj.detach(),
                           shared_gate_up, sh.down_proj.weight.detach(), weights, ids)  # fmt: skip
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_shared_pass_validation():
    x, w_gu, w_d = torch.randn(3, 8), torch.randn(4, 6, 8), torch.randn(4, 8, 3)
    w, ids = torch.ones(3, 3), torch.zeros(3, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="shared_down must"):
        fused_moe_shared(x, w_gu, w_d, torch.randn(10, 8), torch.randn(8, 4), w, ids)
    with pytest.raises(ValueError, match="shared_gate_up must"):
        fused_moe_shared(x, w_gu, w_d, torch.randn(10, 7), torch.randn(8, 5), w, ids)
    with pytest.raises(ValueError, match="shared slot"):
        fused_moe_shared(x, w_gu, w_d, torch.randn(10, 8), torch.randn(8, 5), w[:, :1], ids[:, :1])


PASS_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.moe import moe_expert_pass as p
    from lightllm_mtp.kernels.moe.moe_routing import route_topk_ref
    gen = torch.Generator().manual_seed(0)
    # (T, E, k, H, I, I_shared or None): one token; shared I != routed I; experts with > BLOCK_M rows (2+ blocks);
    # H and I not multiples of the tiles; routed-only; 16 tokens
    cases = ((1, 8, 2, 40, 24, 40), (40, 4, 2, 48, 40, 8), (7, 16, 4, 136, 48, 16), (20, 6, 3, 32, 16, None),
             (16, 12, 3, 40, 24, 40), (5, 6, 3, 32, 16, None))
    for t, experts, top_k, hidden, inter, shared in cases:
        x = torch.randn(t, hidden + 8, generator=gen)[:, 3 : 3 + hidden]  # strided rows
        w_gu = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2
        w_d = torch.randn(experts, hidden, inter, generator=gen) * 0.2
        s_gu = torch.randn(2 * shared, hidden, generator=gen) * 0.2 if shared else None
        s_d = torch.randn(hidden, shared, generator=gen) * 0.2 if shared else None
        w, ids = route_topk_ref(torch.randn(t, experts + 1, generator=gen), num_experts=experts, top_k=top_k,
                                shared_gate=shared is not None)
        ref = p.expert_pass_ref(x, w_gu, w_d, w, ids, s_gu, s_d)
        torch.testing.assert_close(p.expert_pass_triton(x, w_gu, w_d, w, ids, s_gu, s_d), ref, rtol=1e-4, atol=1e-4)
    # the alignment handed in by route_align (the layer's path), 35B-like slots
    from lightllm_mtp.kernels.moe.moe_route_align import route_align_triton
    logits = torch.randn(3, 17, generator=gen)
    r = route_align_triton(logits, num_experts=16, top_k=4, shared_gate=True, block_m=16)
    x = torch.randn(3, 48, generator=gen)
    w_gu, w_d = torch.randn(16, 48, 48, generator=gen) * 0.2, torch.randn(16, 48, 24, generator=gen) * 0.2
    s_gu, s_d = torch.randn(32, 48, generator=gen) * 0.2, torch.randn(48, 16, generator=gen) * 0.2
    out = p.expert_pass_triton(x, w_gu, w_d, r.weights, r.ids, s_gu, s_d, alignment=(r.sorted_pairs, r.block_expert))
    ref = p.expert_pass_ref(x, w_gu, w_d, r.weights, r.ids, s_gu, s_d)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    # another launch shape: 32-row tiles, narrow K steps
    tiles = p.ExpertPassTiles(block_m=32, gate_up_block_n=16, gate_up_block_k=32, down_block_n=32, down_block_k=16)
    torch.testing.assert_close(p.expert_pass_triton(x, w_gu, w_d, r.weights, r.ids, s_gu, s_d, tiles), ref,
                               rtol=1e-4, atol=1e-4)
    print("OK")
    """
)


def test_expert_pass_kernels_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(PASS_INTERPRET_SCRIPT)
    assert "OK" in out, out[-3000:]


def _a3b_case(t, seed):
    """Qwen3.5-35B-A3B MoE dims: 256 experts, top-8, H 2048, I 512, shared I 512; bf16 on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    experts, hidden, inter = 256, 2048, 512

    def randn(*shape, scale=0.03):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).bfloat16()

    w_gu, w_d = randn(experts, 2 * inter, hidden), randn(experts, hidden, inter)
    s_gu, s_d = randn(2 * inter, hidden), randn(hidden, inter)
    x = randn(t, hidden, scale=1.0)
    logits = torch.randn(t, experts + 8, generator=gen, device="cuda")
    return x, w_gu, w_d, s_gu, s_d, logits


# decode rows B = 1..64 and verify layouts B * (k+1): (1, k=1), (8, k=3), (32, k=1), (16, k=5), (64, k=1)
A3B_ROWS = [1, 8, 32, 64, 2, 32 * 2, 16 * 6, 64 * 2]


@pytest.mark.gpu
@pytest.mark.parametrize("t", A3B_ROWS)
def test_shared_pass_gpu_35b_a3b(t):
    x, w_gu, w_d, s_gu, s_d, logits = _a3b_case(t, seed=t)
    weights, ids = route_topk(logits, num_experts=256, top_k=8, shared_gate=True)
    out = fused_moe_shared(x, w_gu, w_d, s_gu, s_d, weights, ids)
    expected = expert_pass_ref(x, w_gu, w_d, weights, ids, s_gu, s_d)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
    again = fused_moe_shared(x, w_gu, w_d, s_gu, s_d, weights, ids)
    assert torch.equal(out, again)  # no atomics: bitwise deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 7, 16])
def test_layer_path_gpu_35b_a3b(t):
    """The layer's small-step path (route_align, its alignment handed to the pass) against the reference and against
    the pass aligned by moe_align; bitwise repeatable."""
    from lightllm_mtp.kernels.moe.moe_route_align import route_align

    x, w_gu, w_d, s_gu, s_d, logits = _a3b_case(t, seed=200 + t)
    r = route_align(logits, num_experts=256, top_k=8, shared_gate=True, block_m=16)
    alignment = (r.sorted_pairs, r.block_expert)
    out = fused_moe_shared(x, w_gu, w_d, s_gu, s_d, r.weights, r.ids, alignment=alignment)
    expected = expert_pass_ref(x, w_gu, w_d, r.weights, r.ids, s_gu, s_d)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(out, fused_moe_shared(x, w_gu, w_d, s_gu, s_d, r.weights, r.ids, alignment=alignment))
    own = expert_pass_triton(x, w_gu, w_d, r.weights, r.ids, s_gu, s_d)  # aligned by moe_align
    assert torch.equal(out, own)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 32, 128])
def test_routed_pass_gpu_35b_a3b(t):
    """fused_moe (routed only) on the expert-major pass against the per-expert reference."""
    x, w_gu, w_d, _, _, logits = _a3b_case(t, seed=100 + t)
    weights, ids = route_topk(logits, num_experts=256, top_k=8)
    out = fused_moe(x, w_gu, w_d, weights, ids)
    expected = fused_moe_ref(x.float(), w_gu.float(), w_d.float(), weights, ids.long())
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)

"""select_experts against HF Qwen3_5MoeTopKRouter."""

import textwrap

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeTopKRouter

from lightllm_mtp.kernels.moe.moe_routing import route_topk, route_topk_ref, select_experts, select_experts_ref, stack_router
from unit_tests.triton_interpreter import run_interpreted


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("experts,top_k,t", [(8, 2, 13), (16, 5, 4), (4, 1, 1)])
def test_matches_hf(dtype, experts, top_k, t):
    torch.manual_seed(experts * top_k + t)
    hidden = 32
    cfg = Qwen3_5MoeTextConfig(hidden_size=hidden, num_experts=experts, num_experts_per_tok=top_k)
    router = Qwen3_5MoeTopKRouter(cfg).to(dtype)
    with torch.no_grad():
        router.weight.copy_(torch.randn(experts, hidden))
    x = torch.randn(t, hidden).to(dtype)
    with torch.no_grad():
        logits, hf_weights, hf_ids = router(x)
    weights, ids = select_experts(F.linear(x, router.weight.detach()), top_k)
    assert weights.dtype == dtype and ids.dtype == torch.int64 and ids.shape == (t, top_k)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)
    torch.testing.assert_close(weights.float().sum(-1), torch.ones(t), rtol=1e-2, atol=1e-2)


def test_validation():
    with pytest.raises(ValueError, match="top_k"):
        select_experts(torch.randn(3, 4), 5)
    with pytest.raises(ValueError, match=": router_logits must"):
        select_experts(torch.randn(3, 4, 2), 1)


# ---- route_topk: the one-kernel routing with the shared gate slot ----




def test_route_topk_ref_matches_hf_router_and_shared_gate():
    torch.manual_seed(5)
    experts, top_k, hidden, t = 12, 3, 16, 7
    cfg = Qwen3_5MoeTextConfig(hidden_size=hidden, num_experts=experts, num_experts_per_tok=top_k)
    router = Qwen3_5MoeTopKRouter(cfg)
    shared_gate = torch.randn(1, hidden)
    with torch.no_grad():
        router.weight.copy_(torch.randn(experts, hidden))
    x = torch.randn(t, hidden)
    with torch.no_grad():
        _, hf_weights, hf_ids = router(x)
    stacked = stack_router(router.weight.detach(), shared_gate)
    assert stacked.shape == (16, hidden) and not stacked[experts + 1 :].any()
    weights, ids = route_topk(F.linear(x, stacked), num_experts=experts, top_k=top_k, shared_gate=True)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (t, top_k + 1)
    assert torch.equal(ids[:, :top_k].long(), hf_ids) and (ids[:, top_k] == experts).all()
    torch.testing.assert_close(weights[:, :top_k], hf_weights)
    torch.testing.assert_close(weights[:, top_k], torch.sigmoid(x @ shared_gate[0]))
    plain, _ = route_topk(F.linear(x, stacked), num_experts=experts, top_k=top_k, renormalize=False)
    torch.testing.assert_close(plain, torch.softmax(x @ router.weight.detach().t(), -1).gather(1, hf_ids))


def test_route_topk_validation():
    with pytest.raises(ValueError, match="top_k"):
        route_topk(torch.randn(3, 4), num_experts=4, top_k=5)
    with pytest.raises(ValueError, match="shared gate"):
        route_topk(torch.randn(3, 4), num_experts=4, top_k=2, shared_gate=True)
    with pytest.raises(ValueError, match="shared_gate must"):
        stack_router(torch.randn(4, 8), torch.randn(2, 8))


ROUTE_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import torch
    from lightllm_mtp.kernels.moe import moe_routing as r
    gen = torch.Generator().manual_seed(0)
    for t, experts, top_k, extra in ((5, 8, 2, 3), (1, 6, 6, 1), (9, 40, 8, 0)):
        logits = torch.randn(t, experts + extra, generator=gen)  # fp32: no ties
        for shared in (False, True) if extra else (False,):
            for renorm in (True, False):
                w, i = r.route_topk_triton(logits, num_experts=experts, top_k=top_k, renormalize=renorm,
                                           shared_gate=shared)
                wr, ir = r.route_topk_ref(logits, num_experts=experts, top_k=top_k, renormalize=renorm,
                                          shared_gate=shared)
                assert torch.equal(i, ir), (i, ir)
                torch.testing.assert_close(w, wr)
    # select_experts' contract (weights in the logits dtype, int64 ids), bf16 logits
    logits = torch.randn(6, 16, generator=gen).bfloat16()
    w, i = r.route_topk_triton(logits, num_experts=16, top_k=4, renormalize=True, shared_gate=False,
                               weights_dtype=torch.bfloat16, ids_dtype=torch.int64)
    probs = torch.softmax(logits.float(), -1)
    wr, _ = r.select_experts_ref(logits, 4)
    assert i.dtype == torch.int64 and w.dtype == torch.bfloat16
    torch.testing.assert_close(probs.gather(1, i), torch.topk(probs, 4).values)  # a top-4 set (bf16 may tie)
    torch.testing.assert_close(w.float(), wr.float(), rtol=8e-3, atol=0)  # 1 ulp: the interpreter truncates to bf16
    # the tie rule: equal probabilities go to the lower expert id
    tied = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0, -1.0]])
    _, i = r.route_topk_triton(tied, num_experts=6, top_k=2, renormalize=True, shared_gate=False)
    assert i.tolist() == [[1, 3]], i
    print("OK")
    """
)


def test_route_topk_kernel_under_the_interpreter():
    pytest.importorskip("triton")
    out = run_interpreted(ROUTE_INTERPRET_SCRIPT)
    assert "OK" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 32, 64, 128])
def test_route_topk_kernel_gpu_35b_a3b_shape(t):
    """256 experts, top-8, the shared gate column, as the layer calls it (fp32 logits: no ties)."""
    gen = torch.Generator().manual_seed(t)
    logits = torch.randn(t, 264, generator=gen).cuda()
    w, i = route_topk(logits, num_experts=256, top_k=8, shared_gate=True)
    wr, ir = route_topk_ref(logits, num_experts=256, top_k=8, shared_gate=True)
    assert torch.equal(i, ir)
    torch.testing.assert_close(w, wr)
    logits = logits.bfloat16()  # select_experts: bf16 weights, int64 ids, the same top-k set up to ties
    w, i = select_experts(logits[:, :256], 8)
    probs = torch.softmax(logits[:, :256].float(), -1)
    torch.testing.assert_close(probs.gather(1, i), torch.topk(probs, 8).values, rtol=0, atol=0)
    expected = select_experts_ref(logits[:, :256], 8)[0]  # within 1 bf16 ulp (fp32 rounding before the cast)
    torch.testing.assert_close(w.float(), expected.float(), rtol=8e-3, atol=0)

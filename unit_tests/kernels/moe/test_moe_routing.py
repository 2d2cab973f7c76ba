"""select_experts against HF Qwen3_5MoeTopKRouter."""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeTopKRouter

from lightllm_mtp.kernels.moe.moe_routing import select_experts


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

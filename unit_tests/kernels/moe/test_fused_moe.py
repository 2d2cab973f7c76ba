"""fused_moe against HF Qwen3_5MoeExperts, with routing from select_experts."""

import pytest
import torch
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeExperts

from lightllm_mtp.kernels.moe.fused_moe import fused_moe, fused_moe_ref
from lightllm_mtp.kernels.moe.moe_routing import select_experts


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("experts,top_k,t,inter", [(8, 2, 11, 16), (6, 3, 1, 24), (16, 4, 30, 8)])
def test_matches_hf(dtype, tol, experts, top_k, t, inter):
    torch.manual_seed(experts + top_k * 7 + t)
    hidden = 32
    cfg = Qwen3_5MoeTextConfig(
        hidden_size=hidden, num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=inter
    )
    hf = Qwen3_5MoeExperts(cfg).to(dtype)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden) * 0.2).to(dtype)
    w_down = (torch.randn(experts, hidden, inter) * 0.2).to(dtype)
    with torch.no_grad():
        hf.gate_up_proj.copy_(w_gate_up)
        hf.down_proj.copy_(w_down)
    x = torch.randn(t, hidden).to(dtype)
    weights, ids = select_experts(torch.randn(t, experts).to(dtype), top_k)
    with torch.no_grad():
        expected = hf(x, ids, weights)
    out = fused_moe(x, w_gate_up, w_down, weights, ids)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    # an independent dense check: every token through its k experts
    gate_up = torch.einsum("tkoh,th->tko", w_gate_up[ids].double(), x.double())  # [T, k, 2I]
    h = torch.nn.functional.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    dense = torch.einsum("tk,tkhi,tki->th", weights.double(), w_down[ids].double(), h)
    torch.testing.assert_close(out.double(), dense, rtol=5 * tol, atol=5 * tol)


def test_validation():
    x = torch.randn(3, 8)
    ids = torch.zeros(3, 2, dtype=torch.int64)
    w = torch.ones(3, 2)
    with pytest.raises(ValueError, match=": w_down must"):
        fused_moe(x, torch.randn(4, 6, 8), torch.randn(4, 8, 4), w, ids)
    with pytest.raises(ValueError, match=": topk_weights must"):
        fused_moe(x, torch.randn(4, 6, 8), torch.randn(4, 8, 3), torch.ones(3, 1), ids)
    with pytest.raises(ValueError, match="w_gate_up dtype"):
        fused_moe(x, torch.randn(4, 6, 8).bfloat16(), torch.randn(4, 8, 3), w, ids)


def _moe_case(t, experts, top_k, hidden, inter, device, seed):
    gen = torch.Generator().manual_seed(seed)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.1).bfloat16().to(device)
    w_down = (torch.randn(experts, hidden, inter, generator=gen) * 0.1).bfloat16().to(device)
    x = torch.randn(t, hidden, generator=gen).bfloat16().to(device)
    weights, ids = select_experts(torch.randn(t, experts, generator=gen).to(device), top_k)
    return x, w_gate_up, w_down, weights, ids


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
def test_grouped_gemm_path_matches_reference():
    """The prefill path (expert-sorted rows, two grouped GEMMs) against the per-expert reference; runs on CPU
    where torch._grouped_mm has a CPU kernel, including experts that get no token."""
    from lightllm_mtp.kernels.moe.fused_moe import fused_moe_grouped

    x, w_gate_up, w_down, weights, ids = _moe_case(40, 16, 4, 64, 32, "cpu", seed=3)
    ids = torch.stack([torch.randperm(12, generator=torch.Generator().manual_seed(i))[:4] for i in range(40)])  # 12..15 idle
    expected = fused_moe_ref(x.float(), w_gate_up.float(), w_down.float(), weights, ids)
    out = fused_moe_grouped(x, w_gate_up, w_down, weights, ids)
    torch.testing.assert_close(out.float(), expected, rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
def test_grouped_gemm_path_on_gpu_at_prefill_size():
    """Above the GEMV row limit fused_moe takes the grouped-GEMM path on CUDA (bf16); Qwen3.5-35B-A3B-like dims."""
    x, w_gate_up, w_down, weights, ids = _moe_case(600, 64, 8, 256, 128, "cuda", seed=4)
    out = fused_moe(x, w_gate_up, w_down, weights, ids)  # 4800 rows: grouped GEMM
    expected = fused_moe_ref(x.float(), w_gate_up.float(), w_down.float(), weights, ids)
    torch.testing.assert_close(out.float(), expected, rtol=3e-2, atol=3e-2)

"""Partial NeoX RoPE against HF Qwen3_5TextRotaryEmbedding (interleaved mRoPE, text positions) +
apply_rotary_pos_emb."""

import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding, apply_rotary_pos_emb

from lightllm_mtp.kernels.attention.rotary import apply_partial_rope, build_rope_cache


def _hf(q, k, positions, head_dim, partial, theta, section):
    cfg = Qwen3_5TextConfig(
        hidden_size=64, num_attention_heads=2, head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial,
                         "mrope_section": section},
    )
    emb = Qwen3_5TextRotaryEmbedding(cfg)
    cos, sin = emb(q, positions[None, :])  # [1, T, R] in q.dtype
    # HF layout [batch, heads, seq, dim]
    qh, kh = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return qh[0].transpose(0, 1), kh[0].transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "head_dim,partial,theta,section,hq,hk",
    [(64, 0.25, 1e7, [3, 3, 2], 4, 2), (32, 1.0, 1e4, [6, 5, 5], 3, 1), (256, 0.25, 1e7, [11, 11, 10], 2, 1)],
)
def test_matches_hf(dtype, head_dim, partial, theta, section, hq, hk):
    torch.manual_seed(head_dim)
    rotary_dim = int(head_dim * partial)
    positions = torch.tensor([0, 1, 2, 3, 17, 18, 5, 511, 200, 9])  # ragged batch: restarts, gaps
    t = positions.shape[0]
    q = torch.randn(t, hq, head_dim).to(dtype)
    k = torch.randn(t, hk, head_dim).to(dtype)
    cos, sin = build_rope_cache(rotary_dim, 512, theta, "cpu")
    assert cos.shape == (512, rotary_dim // 2) and cos.dtype == torch.float32
    q_out, k_out = apply_partial_rope(q, k, positions, cos, sin)
    q_ref, k_ref = _hf(q, k, positions, head_dim, partial, theta, section)
    torch.testing.assert_close(q_out, q_ref, rtol=0, atol=1e-5 if dtype == torch.float32 else 0)
    torch.testing.assert_close(k_out, k_ref, rtol=0, atol=1e-5 if dtype == torch.float32 else 0)
    torch.testing.assert_close(q_out[..., rotary_dim:], q[..., rotary_dim:], rtol=0, atol=0)


def test_position_zero_is_identity_and_norm_preserved():
    cos, sin = build_rope_cache(16, 64, 1e6, "cpu")
    q = torch.randn(3, 2, 32)
    k = torch.randn(3, 1, 32)
    q_out, k_out = apply_partial_rope(q, k, torch.tensor([0, 40, 63]), cos, sin)
    torch.testing.assert_close(q_out[0], q[0])
    torch.testing.assert_close(q_out[..., :16].norm(dim=-1), q[..., :16].norm(dim=-1))


def test_validation():
    cos, sin = build_rope_cache(16, 8, 1e4, "cpu")
    q, k = torch.randn(3, 2, 32), torch.randn(3, 1, 32)
    with pytest.raises(ValueError, match=": positions must"):
        apply_partial_rope(q, k, torch.zeros(4, dtype=torch.int64), cos, sin)
    with pytest.raises(ValueError, match=": k must"):
        apply_partial_rope(q, torch.randn(3, 1, 16), torch.zeros(3, dtype=torch.int64), cos, sin)
    with pytest.raises(ValueError, match=": sin must"):
        apply_partial_rope(q, k, torch.zeros(3, dtype=torch.int64), cos, sin[:, :4])
    with pytest.raises(ValueError, match="rotary_dim"):
        build_rope_cache(15, 8, 1e4)


@pytest.mark.gpu
@pytest.mark.parametrize("bsz", [1, 8, 32])
def test_triton_matches_reference_gpu(bsz):
    from lightllm_mtp.kernels.attention.rotary import apply_partial_rope_ref, apply_partial_rope_triton, build_rope_cache

    torch.manual_seed(bsz)
    dev, dt = "cuda", torch.bfloat16
    cos, sin = build_rope_cache(64, 40960, 10_000_000.0, device=dev)
    q = torch.randn(bsz, 24, 256, device=dev).to(dt)
    k = torch.randn(bsz, 4, 256, device=dev).to(dt)
    positions = torch.randint(0, 40960, (bsz,), device=dev)
    q_out, k_out = apply_partial_rope_triton(q, k, positions, cos, sin)
    q_ref, k_ref = apply_partial_rope_ref(q, k, positions, cos, sin)
    torch.testing.assert_close(q_out, q_ref, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(k_out, k_ref, rtol=1.6e-2, atol=1e-2)

"""RoPE scaling frequencies and the cos / sin cache against HF: the same bits as Qwen3_5TextRotaryEmbedding's
inv_freq, attention scaling, cos and sin (which run HF's rope init functions) for every served type."""

import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

from lightllm_mtp.config.rope_scaling import parse_rope_scaling
from lightllm_mtp.kernels.attention.rope_frequencies import rope_inv_freq
from lightllm_mtp.kernels.attention.rotary import build_rope_cache

QWEN = {"rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": True}
CASES = [
    # the published Qwen3.5 YaRN settings (head_dim 256, rotary 64, theta 1e7, 262144 native) at factor 2 and 4
    (256, 262144, dict(QWEN, rope_type="yarn", factor=4.0, original_max_position_embeddings=262144)),
    (256, 262144, dict(QWEN, rope_type="yarn", factor=2, original_max_position_embeddings=262144)),
    # a small window and theta, so the ramp blends several frequencies; the options HF reads
    (32, 64, dict(rope_type="yarn", rope_theta=1e4, partial_rotary_factor=1.0, factor=4,
                  original_max_position_embeddings=64)),
    (32, 64, dict(rope_type="yarn", rope_theta=1e4, partial_rotary_factor=1.0, factor=8,
                  original_max_position_embeddings=64, truncate=False, beta_fast=16, beta_slow=2)),
    (64, 4096, dict(rope_type="yarn", rope_theta=1e4, partial_rotary_factor=0.5, factor=40, mscale=1.0,
                    mscale_all_dim=0.707, original_max_position_embeddings=4096)),
    (64, 4096, dict(rope_type="yarn", rope_theta=1e4, partial_rotary_factor=0.5, factor=4, attention_factor=0.9,
                    original_max_position_embeddings=4096)),
    (256, 262144, dict(QWEN, rope_type="linear", factor=4.0)),
    (256, 8192, dict(QWEN, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=8192)),
    (128, 8192, dict(rope_type="llama3", rope_theta=5e5, partial_rotary_factor=1.0, factor=8.0, low_freq_factor=1.0,
                     high_freq_factor=4.0, original_max_position_embeddings=8192)),
    (256, 262144, dict(QWEN, rope_type="default")),
]


def hf_rotary(head_dim, max_positions, rope):
    cfg = Qwen3_5TextConfig(hidden_size=64, num_attention_heads=2, head_dim=head_dim,
                            max_position_embeddings=max_positions, rope_parameters=dict(rope))  # fmt: skip
    return Qwen3_5TextRotaryEmbedding(cfg)


@pytest.mark.parametrize("head_dim,max_positions,rope", CASES)
def test_frequencies_and_attention_factor_are_hf_bits(head_dim, max_positions, rope):
    hf = hf_rotary(head_dim, max_positions, rope)
    rotary_dim = int(head_dim * rope["partial_rotary_factor"])
    scaling = parse_rope_scaling(rope, max_positions)
    inv_freq, factor = rope_inv_freq(rotary_dim, rope["rope_theta"], scaling)
    assert inv_freq.dtype == torch.float32 and torch.equal(inv_freq, hf.inv_freq)
    assert factor == hf.attention_scaling
    if rope["rope_type"] != "default":  # every scaled type changes some frequency
        plain, _ = rope_inv_freq(rotary_dim, rope["rope_theta"])
        assert not torch.equal(plain, inv_freq)


@pytest.mark.parametrize("head_dim,max_positions,rope", CASES[:3] + CASES[-3:])
def test_cos_sin_cache_equals_hf_at_positions_past_the_window(head_dim, max_positions, rope):
    """cos / sin (attention factor included) at positions up to 4x the original window and at 1M - 1."""
    hf = hf_rotary(head_dim, max_positions, rope)
    rotary_dim = int(head_dim * rope["partial_rotary_factor"])
    scaling = parse_rope_scaling(rope, max_positions)
    window = scaling.max_positions if scaling is not None else max_positions
    positions = torch.tensor(sorted({0, 1, max_positions - 1, max_positions, window - 1, 4 * max_positions - 1,
                                     (1 << 20) - 1}))  # fmt: skip
    x = torch.zeros(1, dtype=torch.float32)
    hf_cos, hf_sin = hf(x, positions[None, :])  # [1, T, rotary_dim] fp32: the halves repeated
    cos, sin = build_rope_cache(rotary_dim, int(positions.max()) + 1, rope["rope_theta"], scaling=scaling)
    half = rotary_dim // 2
    assert torch.equal(cos[positions], hf_cos[0, :, :half]) and torch.equal(cos[positions], hf_cos[0, :, half:])
    assert torch.equal(sin[positions], hf_sin[0, :, :half]) and torch.equal(sin[positions], hf_sin[0, :, half:])


def test_yarn_attention_factor_scales_cos_and_sin():
    rope = dict(QWEN, rope_type="yarn", factor=4.0, original_max_position_embeddings=262144)
    scaling = parse_rope_scaling(rope, 262144)
    assert scaling.attention_factor == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1.0)
    cos, sin = build_rope_cache(64, 8, 1e7, scaling=scaling)
    assert cos[0].tolist() == [pytest.approx(scaling.attention_factor)] * 32 and not sin[0].any()

"""Published Qwen3.5 text-backbone shapes (flat HF text configs) for random-weight benchmarks.

Sizes from the released configs (see the project's model notes): head_dim 256, rotary 64, GDN head dims 128,
conv 4, vocab 248320. Only geometry matters for timing; weights are random."""

from __future__ import annotations

_COMMON = {
    "vocab_size": 248320,
    "head_dim": 256,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    "attn_output_gate": True,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "mtp_num_hidden_layers": 1,
    "hidden_act": "silu",
}


def _dense(layers, hidden, inter, heads, kv, nk, nv, tied):
    return {
        **_COMMON,
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "linear_num_key_heads": nk,
        "linear_num_value_heads": nv,
        "tie_word_embeddings": tied,
    }


def _moe(layers, hidden, heads, kv, nk, nv, experts, topk, moe_inter, shared):
    return {
        **_COMMON,
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "linear_num_key_heads": nk,
        "linear_num_value_heads": nv,
        "num_experts": experts,
        "num_experts_per_tok": topk,
        "moe_intermediate_size": moe_inter,
        "shared_expert_intermediate_size": shared,
        "tie_word_embeddings": False,
    }


MODEL_SHAPES: dict[str, dict] = {
    "qwen3.5-0.8b": _dense(24, 1024, 3584, 8, 2, 16, 16, True),
    "qwen3.5-2b": _dense(24, 2048, 6144, 8, 2, 16, 16, True),
    "qwen3.5-4b": _dense(32, 2560, 9216, 16, 4, 16, 32, True),
    "qwen3.5-9b": _dense(32, 4096, 12288, 16, 4, 16, 32, False),
    "qwen3.5-27b": _dense(64, 5120, 17408, 24, 4, 16, 48, False),
    "qwen3.5-35b-a3b": _moe(40, 2048, 16, 2, 16, 32, 256, 8, 512, 512),
    "qwen3.5-122b-a10b": _moe(48, 3072, 32, 2, 16, 64, 256, 8, 1024, 1024),
}

# The published -FP8 checkpoints' layout at the same shapes: block-FP8 (128 x 128) projections with fp32 scales
# (random weights quantized on the device), everything else 16-bit; `-fp8` after each name.
FP8_QUANTIZATION_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                           "weight_block_size": [128, 128], "modules_to_not_convert": []}  # fmt: skip
MODEL_SHAPES.update({f"{name}-fp8": {**shape, "quantization_config": FP8_QUANTIZATION_CONFIG}
                     for name, shape in list(MODEL_SHAPES.items())})  # fmt: skip

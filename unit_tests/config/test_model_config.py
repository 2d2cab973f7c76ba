import copy
import json

import pytest

from lightllm_mtp.config.model_config import LayerType, ModelConfig, ModelConfigError, ModelType

TEXT = {
    "model_type": "qwen3_5_text",
    "vocab_size": 1000,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    "attn_output_gate": True,
    "mtp_num_hidden_layers": 1,
    "tie_word_embeddings": False,
    "eos_token_id": 7,
    "max_position_embeddings": 2048,
}
MOE_FIELDS = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}


def wrapper(text, arch="Qwen3_5ForConditionalGeneration", model_type="qwen3_5"):
    return {"architectures": [arch], "model_type": model_type, "text_config": text, "vision_config": {"depth": 1}}


def test_wrapper_layout_dense():
    cfg = ModelConfig.from_hf(wrapper(dict(TEXT)))
    assert cfg.model_type is ModelType.QWEN3_5
    assert cfg.weight_prefix == "model.language_model."
    assert cfg.full_attention_layers == (3, 7)
    assert cfg.linear_attention_layers == (0, 1, 2, 4, 5, 6)
    assert cfg.rotary_dim == 8 and cfg.rope_theta == 1e7
    assert cfg.linear_conv_dim == 2 * 32 + 64
    assert cfg.mtp_num_hidden_layers == 1 and cfg.eos_token_ids == (7,)
    assert not cfg.is_moe and cfg.intermediate_size == 128


def test_flat_layout_moe_and_explicit_layer_types():
    text = dict(TEXT, **MOE_FIELDS, model_type="qwen3_5_moe_text", architectures=["Qwen3_5MoeForCausalLM"])
    text["layer_types"] = ["full_attention"] + ["linear_attention"] * 7
    del text["intermediate_size"]
    cfg = ModelConfig.from_hf(text)
    assert cfg.model_type is ModelType.QWEN3_5_MOE and cfg.is_moe
    assert cfg.weight_prefix == "model."
    assert cfg.layer_types[0] is LayerType.FULL_ATTENTION and cfg.full_attention_layers == (0,)
    assert cfg.moe.num_experts == 8 and cfg.moe.shared_expert_intermediate_size == 48


def test_tied_embeddings_read_from_either_level():
    text = dict(TEXT)
    del text["tie_word_embeddings"]
    hf = wrapper(text)
    hf["tie_word_embeddings"] = True
    assert ModelConfig.from_hf(hf).tie_word_embeddings
    assert ModelConfig.from_hf(wrapper(dict(TEXT, tie_word_embeddings=True))).tie_word_embeddings


def test_partial_rotary_factor_at_top_level():
    text = dict(TEXT, partial_rotary_factor=0.5, rope_theta=1e4)
    del text["rope_parameters"]
    cfg = ModelConfig.from_hf(wrapper(text))
    assert cfg.rotary_dim == 16 and cfg.rope_theta == 1e4


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda h: h.update(architectures=["LlamaForCausalLM"]), "architectures"),
        (lambda h: h.update(architectures=[], model_type="llama"), "model_type"),
        (lambda h: h["text_config"].pop("hidden_size"), "hidden_size"),
        (lambda h: h["text_config"].update(num_key_value_heads=3), "num_attention_heads"),
        (lambda h: h["text_config"].update(layer_types=["full_attention"] * 3), "layer_types"),
        (lambda h: h["text_config"].update(layer_types=["sliding"] * 8), "layer_types"),
        (lambda h: h["text_config"].update(hidden_act="gelu"), "hidden_act"),
        (lambda h: h["text_config"]["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
        (lambda h: h["text_config"].update(linear_num_value_heads=3), "linear_num_value_heads"),
        (lambda h: h["text_config"].update(vocab_size="big"), "vocab_size"),
        (lambda h: h.update(text_config=None), "text_config"),
    ],
)
def test_unsupported_configs_name_the_field(mutate, field):
    hf = wrapper(copy.deepcopy(TEXT))
    mutate(hf)
    with pytest.raises(ModelConfigError, match=field):
        ModelConfig.from_hf(hf)


def test_moe_missing_field():
    text = dict(TEXT, **MOE_FIELDS)
    del text["num_experts"]
    with pytest.raises(ModelConfigError, match="num_experts"):
        ModelConfig.from_hf(wrapper(text, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"))


def test_from_model_dir(tmp_path):
    with pytest.raises(ModelConfigError, match="config.json not found"):
        ModelConfig.from_model_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(wrapper(dict(TEXT))))
    assert ModelConfig.from_model_dir(tmp_path).hidden_size == 64

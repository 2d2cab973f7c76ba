"""config.json's quantization_config (config/quant_config.py): the published -FP8 form parses; anything else this
engine cannot run is refused with the field named; the engine options around it."""

import pytest

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig, ModelConfigError
from lightllm_mtp.config.quant_config import QuantConfig, quant_config_of

PUBLISHED = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
             "modules_to_not_convert": ["lm_head", "model.visual.blocks.0.attn.qkv"]}  # fmt: skip
TEXT = {"architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 8, "hidden_size": 16, "num_hidden_layers": 1,
        "intermediate_size": 8, "num_attention_heads": 1, "num_key_value_heads": 1, "linear_num_key_heads": 1,
        "linear_num_value_heads": 1, "linear_key_head_dim": 4, "linear_value_head_dim": 4}  # fmt: skip


def test_published_form_round_trips():
    q = QuantConfig.from_hf(PUBLISHED)
    assert q.block == (128, 128) and q.modules_to_not_convert[0] == "lm_head" and not q.online
    assert QuantConfig.from_hf(q.to_hf()) == q
    assert quant_config_of({"text_config": {"quantization_config": PUBLISHED}}) == q
    assert quant_config_of({}) is None
    assert ModelConfig.from_hf({**TEXT, "quantization_config": PUBLISHED}).quantization == q


@pytest.mark.parametrize("change, message", [
    ({"quant_method": "awq"}, "quant_method' = 'awq' is not supported"),
    ({"fmt": "e5m2"}, "fmt' = 'e5m2' is not supported"),
    ({"activation_scheme": "static"}, "activation_scheme' = 'static' is not supported"),
    ({"weight_block_size": None}, "weight_block_size' must be \\[rows, columns\\]"),
    ({"weight_block_size": [128, 96]}, "power of two >= 16"),
    ({"modules_to_not_convert": "lm_head"}, "modules_to_not_convert' must be a list"),
])  # fmt: skip
def test_what_cannot_run_is_refused_by_field(change, message):
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_hf({**TEXT, "quantization_config": {**PUBLISHED, **change}})


def test_engine_options():
    args = EngineArgs(model_dir="-", quantization="fp8", kv_cache_dtype="fp8_e4m3")
    assert args.online_quant.block == (128, 128) and args.online_quant.online
    assert args.kv_cache_dtype == "fp8" and args.draft_kv_dtype == args.dtype
    assert EngineArgs(model_dir="-", quantization="none").online_quant is None
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineArgs(model_dir="-", quantization="int4")
    with pytest.raises(ValueError, match="draft_kv_cache_dtype must be one of"):
        EngineArgs(model_dir="-", draft_kv_cache_dtype="fp16")

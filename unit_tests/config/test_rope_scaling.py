"""RoPE scaling in the model config and the engine options: what is served, what is refused at start-up and how, the
rope_scaling override, and max_model_len up to the scaled window."""

import copy
import json

import pytest

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig, ModelConfigError
from unit_tests.config.test_model_config import TEXT, wrapper

MROPE = {"mrope_section": [2, 1, 1], "mrope_interleaved": True}
YARN_4X = {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 262144}


def config(rope=None, max_position_embeddings=262144, override=None, **text_fields):
    text = copy.deepcopy(TEXT)
    text["rope_parameters"].update(MROPE, **(rope or {}))
    text.update(max_position_embeddings=max_position_embeddings, **text_fields)
    return ModelConfig.from_hf(wrapper(text), override)


def test_published_yarn_settings_scale_the_window_to_1m():
    cfg = config(YARN_4X)
    s = cfg.rope_scaling
    assert (s.rope_type, s.factor, s.original_max_position_embeddings) == ("yarn", 4.0, 262144)
    assert cfg.max_context_len == 1048576 and cfg.max_position_embeddings == 262144
    assert s.attention_factor == pytest.approx(1.1386294361)
    assert (cfg.rotary_dim, cfg.rope_theta) == (8, 1e7)  # the M-RoPE fields beside it are accepted


def test_default_and_older_rope_scaling_key():
    assert config().rope_scaling is None and config().max_context_len == 262144
    text = copy.deepcopy(TEXT)
    del text["rope_parameters"]
    text.update(rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=1e6, max_position_embeddings=1000)
    cfg = ModelConfig.from_hf(wrapper(text))
    assert cfg.rope_scaling.rope_type == "linear" and cfg.max_context_len == 2000 and cfg.rope_theta == 1e6


def test_yarn_window_defaults_to_max_position_embeddings_and_config_level_original_wins():
    assert config({"rope_type": "yarn", "factor": 2}, max_position_embeddings=1000).max_context_len == 2000
    cfg = config({"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 1000},
                 original_max_position_embeddings=500)  # fmt: skip
    assert cfg.rope_scaling.original_max_position_embeddings == 500  # HF's standardisation prefers it too


@pytest.mark.parametrize("rope, message", [
    ({"rope_type": "dynamic", "factor": 2}, "'dynamic' is not supported: dynamic NTK recomputes"),
    ({"rope_type": "longrope", "short_factor": [1], "long_factor": [2]}, "'longrope' is not supported"),
    ({"rope_type": "proportional"}, "'proportional' is not supported"),
    ({"rope_type": "ntk-by-parts", "factor": 2}, r"'ntk-by-parts' is not supported; supported: \['default'"),
    ({"rope_type": "yarn"}, r"'yarn' needs \['factor'\]"),
    ({"rope_type": "yarn", "factor": 4, "orig_max_position_embeddings": 64}, "does not take.*orig_max_position"),
    ({"rope_type": "yarn", "factor": 0.5}, "'factor' must be >= 1"),
    ({"rope_type": "yarn", "factor": "4"}, "'factor' must be a number"),
    ({"rope_type": "yarn", "factor": 4, "attention_factor": -1.0}, "attention_factor' must be > 0"),
    ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 6.5}, "must be a positive int"),
    ({"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 64}, "needs.*low_freq_factor"),
    ({"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 64, "low_freq_factor": 4,
      "high_freq_factor": 1}, "must exceed 'low_freq_factor'"),
])  # fmt: skip
def test_unserved_scalings_are_start_up_errors_naming_the_type_or_key(rope, message):
    with pytest.raises(ModelConfigError, match=f"field 'rope_parameters': .*{message}"):
        config(rope)


def test_override_replaces_the_scaling_and_keeps_theta_and_mrope():
    cfg = config({"rope_type": "linear", "factor": 8}, override=YARN_4X)
    assert cfg.rope_scaling.rope_type == "yarn" and cfg.rope_scaling.factor == 4.0 and cfg.rope_theta == 1e7
    assert config(YARN_4X, override={"rope_type": "default"}).rope_scaling is None
    with pytest.raises(ModelConfigError, match="the rope_scaling option: rope_type 'yarn' needs"):
        config(override={"rope_type": "yarn"})


def test_engine_option_parses_json_and_refuses_bad_values():
    text = json.dumps(YARN_4X)
    assert EngineArgs("m", rope_scaling=text).rope_scaling == YARN_4X
    assert EngineArgs("m", rope_scaling=YARN_4X).rope_scaling == YARN_4X  # LLM(...) passes a dict
    assert EngineArgs("m").rope_scaling is None
    for bad, message in [("{yarn}", "must be a JSON object"), ("[1]", "must be a JSON object"),
                         ('{"factor": 4}', "needs a 'rope_type'"), ('{"rope_type": "dynamic", "factor": 2}',
                                                                    "'dynamic' is not supported")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            EngineArgs("m", rope_scaling=bad)


def test_max_model_len_up_to_the_scaled_window():
    cfg = config(YARN_4X)
    assert EngineArgs("m", max_model_len=1048576).resolved_max_model_len(cfg) == 1048576
    assert EngineArgs("m").resolved_max_model_len(cfg) == 4096
    with pytest.raises(ValueError, match=r"exceeds the scaled context window 1048576 \(yarn factor 4 x "
                                         "original_max_position_embeddings 262144"):  # fmt: skip
        EngineArgs("m", max_model_len=1048577).resolved_max_model_len(cfg)
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings 262144; longer contexts need "
                                         "RoPE scaling"):  # fmt: skip
        EngineArgs("m", max_model_len=262145).resolved_max_model_len(config())


def test_engine_and_server_take_the_override(tiny_dense_dir):
    from lightllm_mtp import LLM
    from lightllm_mtp.server.args import parse_server_args

    flag = json.dumps({"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 4096})
    server = parse_server_args(["--model_dir", str(tiny_dense_dir), "--rope_scaling", flag, "--max_model_len", "8192"])
    assert server.engine.model_config().max_context_len == 8192
    llm = LLM(tiny_dense_dir, max_model_len=8192, max_total_token_num=8200, rope_scaling=flag)
    assert llm.engine.max_model_len == 8192 and llm.engine.model_config.rope_scaling.factor == 2.0
    assert llm.engine.model.caches.rope_cos.shape[0] >= 8192
    with pytest.raises(SystemExit):
        parse_server_args(["--model_dir", str(tiny_dense_dir), "--rope_scaling", flag, "--max_model_len", "8193"])

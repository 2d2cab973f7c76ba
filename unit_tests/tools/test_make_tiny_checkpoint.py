"""The tiny checkpoint builder: published Qwen3.5 layout, config, determinism, tokenizer, HF loading, CLI."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lightllm_mtp.tools.make_tiny_checkpoint import SPECIAL_TOKENS, build_tiny_checkpoint
from lightllm_mtp.tools.published_layout import fuse_experts
from unit_tests.hf_reference import hf_greedy, hf_prefill_logits, load_hf_causal_lm

H = 64
PREFIXES = ("model.language_model.", "model.visual.", "lm_head.", "mtp.")


def read_tensors(model_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (shard file, shape), read from the shards themselves."""
    out = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():
                assert name not in out, f"{name} stored twice"
                out[name] = (shard.name, tuple(f.get_slice(name).get_shape()))
    return out


def load_all(model_dir: Path) -> dict[str, torch.Tensor]:
    return {k: v for shard in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(str(shard)).items()}


def config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


@pytest.fixture(params=["dense", "moe"])
def model_dir(request, tiny_dense_dir, tiny_moe_dir):
    return Path({"dense": tiny_dense_dir, "moe": tiny_moe_dir}[request.param])


def test_index_matches_shards_and_names_follow_published_layout(model_dir):
    tensors = read_tensors(model_dir)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {name: shard for name, (shard, _) in tensors.items()}
    shards = sorted({shard for shard, _ in tensors.values()})
    assert len(shards) > 1 and all(re.fullmatch(rf"model-\d{{5}}-of-{len(shards):05d}\.safetensors", s) for s in shards)
    assert all(name.startswith(PREFIXES) for name in tensors)
    assert any(name.startswith("model.visual.") for name in tensors)
    vocab = config(model_dir)["text_config"]["vocab_size"]
    assert tensors["lm_head.weight"][1] == tensors["model.language_model.embed_tokens.weight"][1] == (vocab, H)
    gdn = "model.language_model.layers.0.linear_attn."
    assert tensors[gdn + "in_proj_qkv.weight"][1] == (2 * 2 * 16 + 4 * 16, H)
    assert tensors[gdn + "conv1d.weight"][1] == (128, 1, 4)
    assert tensors[gdn + "A_log"][1] == tensors[gdn + "dt_bias"][1] == (4,)
    assert tensors[gdn + "norm.weight"][1] == (16,)
    assert tensors["model.language_model.layers.3.self_attn.q_proj.weight"][1] == (2 * 4 * 32, H)
    main = [n for n in tensors if n.startswith("model.language_model.layers.")]
    assert not any(".layers.3.linear_attn." in n or ".layers.0.self_attn." in n for n in main)


def _fused_shapes(shapes: dict[str, tuple]) -> dict[str, tuple]:
    """name -> shape with per-expert `experts.{e}.*` entries folded into the fused 3-D names and shapes."""
    fused = fuse_experts({n: torch.empty(s) for n, s in shapes.items()})
    return {n: tuple(t.shape) for n, t in fused.items()}


def test_mtp_tensors_mirror_a_main_full_attention_layer(model_dir):
    tensors = read_tensors(model_dir)
    assert tensors["mtp.fc.weight"][1] == (H, 2 * H)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        assert tensors[f"mtp.{name}.weight"][1] == (H,)
    main = {n[len("model.language_model.layers.3.") :]: s for n, (_, s) in tensors.items() if ".layers.3." in n}
    mtp = {n[len("mtp.layers.0.") :]: s for n, (_, s) in tensors.items() if n.startswith("mtp.layers.0.")}
    # the same tensors up to the expert layout (MoE: fused in the main model, per expert in mtp.*, as published)
    assert _fused_shapes(mtp) == _fused_shapes(main)
    assert {"input_layernorm.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight"} <= set(mtp)
    assert not any(n.startswith("mtp.layers.1.") for n in tensors)
    assert not any("embed_tokens" in n or "lm_head" in n for n in tensors if n.startswith("mtp."))


def test_moe_expert_layout(tiny_moe_dir, tmp_path):
    tensors = read_tensors(Path(tiny_moe_dir))
    # as published for Qwen3.5 MoE: fused 3-D experts in the main model, per-expert tensors in the MTP layer
    main, mtp = "model.language_model.layers.0.mlp.", "mtp.layers.0.mlp."
    assert tensors[main + "experts.gate_up_proj"][1] == (8, 64, H)
    assert tensors[main + "experts.down_proj"][1] == (8, H, 32)
    assert not any(n.startswith(main + "experts.0.") for n in tensors)
    assert tensors[mtp + "experts.7.gate_proj.weight"][1] == (32, H)
    assert tensors[mtp + "experts.7.down_proj.weight"][1] == (H, 32)
    assert mtp + "experts.gate_up_proj" not in tensors
    for prefix in (main, mtp):
        assert tensors[prefix + "gate.weight"][1] == (8, H)
        assert tensors[prefix + "shared_expert.up_proj.weight"][1] == (48, H)
        assert tensors[prefix + "shared_expert_gate.weight"][1] == (1, H)


def test_tied_variant_has_no_lm_head(tiny_dense_tied_dir, tiny_dense_dir):
    tied = read_tensors(Path(tiny_dense_tied_dir))
    assert "lm_head.weight" not in tied and "model.language_model.embed_tokens.weight" in tied
    assert config(Path(tiny_dense_tied_dir))["tie_word_embeddings"] is True
    assert config(Path(tiny_dense_tied_dir))["text_config"]["tie_word_embeddings"] is True
    assert config(Path(tiny_dense_dir))["tie_word_embeddings"] is False


def test_config_fields(tiny_dense_dir, tiny_moe_dir):
    dense, moe = config(Path(tiny_dense_dir)), config(Path(tiny_moe_dir))
    assert dense["architectures"] == ["Qwen3_5ForConditionalGeneration"] and dense["model_type"] == "qwen3_5"
    assert moe["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and moe["model_type"] == "qwen3_5_moe"
    for cfg in (dense, moe):
        text = cfg["text_config"]
        assert text["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 2
        assert (text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (
            64,
            4,
            2,
            32,
        )
        assert (text["linear_num_key_heads"], text["linear_num_value_heads"]) == (2, 4)
        assert text["attn_output_gate"] is True and text["mtp_num_hidden_layers"] == 1
        rope = text["rope_parameters"]
        assert rope["partial_rotary_factor"] == 0.25 and rope["mrope_interleaved"] is True
        assert sum(rope["mrope_section"]) == 32 * 0.25 / 2
        assert text["vocab_size"] % 64 == 0 and cfg["vision_config"]["out_hidden_size"] == 64
        assert text["eos_token_id"] == text["bos_token_id"] == text["pad_token_id"] == cfg["eos_token_id"]
    assert dense["text_config"]["intermediate_size"] == 128
    assert (moe["text_config"]["num_experts"], moe["text_config"]["num_experts_per_tok"]) == (8, 2)
    gen = json.loads((Path(tiny_dense_dir) / "generation_config.json").read_text())
    assert gen["eos_token_id"] == dense["text_config"]["eos_token_id"]


def test_same_seed_same_bytes_other_seed_differs_and_no_mtp_layers(tiny_dense_dir, tmp_path):
    again = build_tiny_checkpoint("qwen3_5", tmp_path / "again", mtp_layers=1, seed=0)
    files = sorted(p.name for p in Path(tiny_dense_dir).iterdir())
    assert files == sorted(p.name for p in again.iterdir())
    for name in files:
        assert (again / name).read_bytes() == (Path(tiny_dense_dir) / name).read_bytes(), name
    other = build_tiny_checkpoint("qwen3_5", tmp_path / "other", mtp_layers=0, seed=1)
    assert (other / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()
    embed = "model.language_model.embed_tokens.weight"
    assert not torch.equal(load_all(other)[embed], load_all(again)[embed])
    assert not any(n.startswith("mtp.") for n in read_tensors(other))  # no draft head at all
    assert config(other)["text_config"]["mtp_num_hidden_layers"] == 0

def test_tokenizer_round_trip_and_specials(tiny_dense_dir):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dense_dir)
    raw = Tokenizer.from_file(str(Path(tiny_dense_dir) / "tokenizer.json"))
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)  # café ✓\n\tprint('ok')"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and raw.encode(text).ids == ids
    assert len(ids) < 0.6 * len(text)  # real merges, not bytes
    text_cfg = json.loads((Path(tiny_dense_dir) / "config.json").read_text())["text_config"]
    assert 2000 <= len(tok) <= text_cfg["vocab_size"] < len(tok) + 64
    special = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert tok.eos_token_id == special[0] == text_cfg["eos_token_id"]
    assert tok("<|im_start|>user<|im_end|>")["input_ids"][0] == special[1]
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_hf_loads_and_greedy_decodes(model_dir):
    model = load_hf_causal_lm(model_dir)
    assert not any(n.startswith("mtp") for n, _ in model.named_parameters())
    prompt = [5, 17, 300, 42, 9, 77, 1024, 3]
    tokens, step_logits = hf_greedy(model_dir, prompt, 8)
    vocab = config(model_dir)["text_config"]["vocab_size"]
    assert len(tokens) == 8 and step_logits.shape == (8, vocab)
    assert step_logits.argmax(-1).tolist() == tokens
    prefill = hf_prefill_logits(model_dir, prompt + tokens[:-1])
    assert prefill.shape == (len(prompt) + 7, vocab)
    torch.testing.assert_close(prefill[len(prompt) - 1 :], step_logits, atol=1e-3, rtol=0)
    top2 = prefill.topk(2, dim=-1).values
    assert ((top2[:, 0] - top2[:, 1]) > 1e-3).float().mean() > 0.9  # clear greedy margins
    assert max(tokens) < 2003  # padded vocab rows are never picked


def test_cli_fused_experts_and_more_mtp_layers(tmp_path):
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "lightllm_mtp.tools.make_tiny_checkpoint", "--arch", "qwen3_5_moe", "--out", str(out)]
    cmd += ["--mtp_layers", "2", "--seed", "3", "--fused_experts", "--tie_word_embeddings"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    tensors = read_tensors(out)
    assert "lm_head.weight" not in tensors and config(out)["text_config"]["mtp_num_hidden_layers"] == 2
    for prefix in ("model.language_model.layers.7.mlp.", "mtp.layers.0.mlp.", "mtp.layers.1.mlp."):
        assert tensors[prefix + "experts.gate_up_proj"][1] == (8, 64, H)
        assert tensors[prefix + "experts.down_proj"][1] == (8, H, 32)
    assert not any(re.search(r"experts\.\d+\.", n) for n in tensors)
    # the same weights as the per-expert layout, and HF reads both to the same model (up to matmul rounding)
    per_expert = build_tiny_checkpoint("qwen3_5_moe", tmp_path / "pe", 2, 3, True, fused_experts=False)
    fused, split = load_all(out), load_all(per_expert)
    assert "mtp.layers.1.mlp.experts.7.up_proj.weight" in split
    assert fused.keys() == fuse_experts(split).keys()
    for name, tensor in fuse_experts(split).items():
        assert torch.equal(fused[name], tensor), name
    gate_up = fused["mtp.layers.1.mlp.experts.gate_up_proj"]
    assert torch.equal(gate_up[7, :32], split["mtp.layers.1.mlp.experts.7.gate_proj.weight"])  # rows [gate; up]
    prompt = [1, 2, 3, 400, 5]
    torch.testing.assert_close(hf_prefill_logits(out, prompt), hf_prefill_logits(per_expert, prompt), atol=1e-4, rtol=0)


def test_ensure_tiny_checkpoint_builds_once_into_the_cache(tmp_path, monkeypatch):
    import dataclasses

    from lightllm_mtp.tools import default_checkpoint, make_tiny_checkpoint

    monkeypatch.setattr(default_checkpoint, "ENV", dataclasses.replace(default_checkpoint.ENV, cache_dir=tmp_path))
    calls = []

    def fake_build(arch, out_dir, **kwargs):
        calls.append((arch, kwargs))
        (Path(out_dir) / "config.json").write_text("{}")
        return Path(out_dir)

    monkeypatch.setattr(make_tiny_checkpoint, "build_tiny_checkpoint", fake_build)
    first = default_checkpoint.ensure_tiny_checkpoint("qwen3_5_moe", mtp_layers=2, tie_word_embeddings=True)
    assert first == default_checkpoint.ensure_tiny_checkpoint("qwen3_5_moe", mtp_layers=2, tie_word_embeddings=True)
    assert len(calls) == 1 and calls[0][1]["seed"] == 0
    assert first.parent == tmp_path / "tiny" and first.name.startswith("qwen3_5_moe-mtp2-seed0-tied")
    assert str(default_checkpoint.RECIPE_VERSION) in first.name and (first / "config.json").exists()
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp dirs left behind

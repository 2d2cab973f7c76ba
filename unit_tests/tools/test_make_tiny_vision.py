"""tools/make_tiny_vision.py: the tiny image-text fixture loads in transformers' Qwen3_5ForConditionalGeneration and
runs an image forward from HF's own processor; its tower and processor equal ours there; its text weights are the
trained fixture's (the text logits over the old vocabulary unchanged)."""

import json

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open

from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.models.qwen3_5_vision.tower import VisionTower
from lightllm_mtp.multimodal.image_processor import ImageProcessor
from lightllm_mtp.tools.make_tiny_vision import CHAT_TEMPLATE, VISION_TOKENS, make_tiny_vision
from unit_tests.grown_fixtures import assert_regrown_identically
from unit_tests.trained_fixtures import trained_fixture_path
from unit_tests.vision_fixture import tiny_vision_dir, tiny_vision_moe_dir  # noqa: F401 (fixtures)

OLD_VOCAB = 4096


def tensors(model_dir) -> dict[str, torch.Tensor]:
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for name, shard in index.items():
        with safe_open(str(model_dir / shard), "pt") as f:
            out[name] = f.get_tensor(name)
    return out


def pictures():
    rng = np.random.default_rng(5)
    return [Image.fromarray(rng.integers(0, 256, (70, 90, 3), dtype=np.uint8)),
            Image.fromarray(rng.integers(0, 256, (20, 20, 4), dtype=np.uint8), "RGBA")]  # fmt: skip


def test_tokens_config_and_text_weights(tiny_vision_dir):
    from transformers import AutoTokenizer

    source = trained_fixture_path("qwen3_5")
    hf = json.loads((tiny_vision_dir / "config.json").read_text())
    ids = [hf[f] for f in ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")]
    assert ids == list(range(OLD_VOCAB, OLD_VOCAB + 4)) and hf["text_config"]["vocab_size"] == OLD_VOCAB + 4
    tok = AutoTokenizer.from_pretrained(tiny_vision_dir)
    assert tok.convert_tokens_to_ids(list(VISION_TOKENS)) == ids
    assert tok.encode("a<|vision_start|><|image_pad|><|vision_end|>b")[1:4] == [ids[0], ids[2], ids[1]]
    cfg = ModelConfig.from_hf(hf)
    assert cfg.vision is not None and cfg.vision.image_token_id == ids[2] and cfg.vision.depth == 2
    old, new = tensors(source), tensors(tiny_vision_dir)
    def text(names):
        return {n for n in names if not n.startswith("model.visual.")}

    assert text(new) == text(old)
    for name, t in old.items():
        if name.startswith("model.visual."):
            continue
        if name in ("lm_head.weight", "model.language_model.embed_tokens.weight"):
            assert new[name].shape == (OLD_VOCAB + 4, t.shape[1]) and torch.equal(new[name][:OLD_VOCAB], t)
        else:
            assert torch.equal(new[name], t), name
    assert (tiny_vision_dir / "chat_template.jinja").read_text() == CHAT_TEMPLATE.read_text()


def test_transformers_runs_an_image_forward(tiny_vision_dir):
    """HF's processor and model on the fixture; our processor and tower give the same patches and embeddings."""
    import transformers

    model, info = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(
        tiny_vision_dir, dtype=torch.float32, output_loading_info=True)  # fmt: skip
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    hf_processor = transformers.AutoImageProcessor.from_pretrained(tiny_vision_dir)
    features = hf_processor(pictures(), return_tensors="pt")
    cfg = ModelConfig.from_hf(json.loads((tiny_vision_dir / "config.json").read_text()))
    inputs = [ImageProcessor.load(tiny_vision_dir, cfg.vision).preprocess(p) for p in pictures()]
    assert [im.grid_thw for im in inputs] == [tuple(g) for g in features["image_grid_thw"].tolist()]
    assert torch.equal(torch.cat([im.pixel_values for im in inputs]), features["pixel_values"])
    ours = VisionTower.load(tiny_vision_dir, cfg.vision, torch.float32, "cpu").forward(inputs)
    with torch.no_grad():
        theirs = model.model.get_image_features(features["pixel_values"], features["image_grid_thw"]).pooler_output
    text_std = model.model.language_model.embed_tokens.weight[:OLD_VOCAB].std().item()
    for o, t in zip(ours, theirs):
        assert (o - t).abs().max().item() < 1e-5
        assert 0.5 * text_std < o.std().item() < 2 * text_std  # embeddings of the text embeddings' order

    start, end, pad = cfg.vision.vision_start_token_id, cfg.vision.vision_end_token_id, cfg.vision.image_token_id
    ids = [10, 20, start, *[pad] * inputs[0].num_tokens, end, 30, start, *[pad] * inputs[1].num_tokens, end, 40]
    ids = torch.tensor([ids])
    with torch.no_grad():
        out = model(input_ids=ids, mm_token_type_ids=(ids == pad).long(), pixel_values=features["pixel_values"],
                    image_grid_thw=features["image_grid_thw"]).logits  # fmt: skip
        blank = model(input_ids=ids, mm_token_type_ids=(ids == pad).long(), pixel_values=features["pixel_values"] * 0,
                      image_grid_thw=features["image_grid_thw"]).logits  # fmt: skip
    assert out.shape == (1, ids.shape[1], OLD_VOCAB + 4) and out.isfinite().all()
    assert (out[0, -1] - blank[0, -1]).abs().max() > 1e-3  # the image reaches the text


def test_text_logits_are_the_trained_fixtures(tiny_vision_dir):
    from unit_tests.hf_reference import hf_prefill_logits

    prompt = [101, 7, 2048, 3000, 55, 4093]
    before = hf_prefill_logits(trained_fixture_path("qwen3_5"), prompt)
    after = hf_prefill_logits(tiny_vision_dir, prompt)
    assert after.shape[1] == OLD_VOCAB + 4
    assert torch.equal(after[:, :OLD_VOCAB], before)
    assert (after[:, OLD_VOCAB:].max(dim=1).values < after[:, :OLD_VOCAB].max(dim=1).values).all()


def test_same_seed_same_files(tiny_vision_dir, tmp_path):
    assert_regrown_identically(make_tiny_vision, tiny_vision_dir, tmp_path)


def test_moe_source(tiny_vision_moe_dir):
    import transformers

    hf = json.loads((tiny_vision_moe_dir / "config.json").read_text())
    assert ModelConfig.from_hf(hf).vision is not None
    model, info = transformers.Qwen3_5MoeForConditionalGeneration.from_pretrained(
        tiny_vision_moe_dir, dtype=torch.float32, output_loading_info=True)  # fmt: skip
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])


def test_engine_generates_the_trained_fixtures_text(tiny_vision_dir):
    """The engine loads the fixture (vocabulary 4100, a vision config) and, on text, decodes as the source does."""
    from lightllm_mtp import LLM, SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0.0, seed=0)
    prompt = "def add(a, b):"
    want = LLM(trained_fixture_path("qwen3_5"), max_model_len=128, max_batch_size=1).generate(prompt, params)
    got = LLM(tiny_vision_dir, max_model_len=128, max_batch_size=1).generate(prompt, params)
    assert got[0].token_ids == want[0].token_ids and len(want[0].token_ids) == 8

"""A tiny image-text Qwen3.5 checkpoint from a trained tiny text one: random tower (seeded), text weights the
trained fixture's.

    python -m lightllm_mtp.tools.make_tiny_vision OUT_DIR [--source DIR] [--seed 0]

From the source (default: the shipped lightllm_mtp/fixtures/tiny_qwen3_5_trained; the MoE or 3-MTP ones under
fixtures/ work the same) it writes OUT_DIR with
- the tokenizer plus 4 special tokens `<|vision_start|>`, `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>`, ids
  right after the vocabulary (4096 .. 4099 for the fixtures), and config.json's vision_start / vision_end / image /
  video token ids set to them;
- the vocabulary grown by those 4 rows in every vocabulary-sized tensor (embed_tokens, lm_head, an MTP module's own
  embedding or head if it has one): seeded random rows, embeddings at the trained rows' scale, head rows at a tenth
  of it (so the trained text rarely predicts them); every other tensor is copied bit for bit;
- a seeded random vision tower `model.visual.*` (TOWER below: 2 blocks, hidden 32, 2 heads, 4-pixel patches), its
  merger's output scaled to the spread of the text embeddings, in the checkpoint's dtype;
- preprocessor_config.json with a small pixel budget (8 x 8 .. 32 x 32 patches: 16 .. 256 image tokens), and the
  shipped Qwen3.5 chat template (chat_templates/qwen3_5.jinja).
transformers' Qwen3_5ForConditionalGeneration loads the result; nothing of it is committed (tests build it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.models.qwen3_5_vision.tower import VisionTower
from lightllm_mtp.multimodal.image_processor import ImageProcessor
from lightllm_mtp.tools.grow_vocab import (
    DEFAULT_SOURCE, NewToken, grow_checkpoint, grow_main, random_rows, write_config, write_index,
)

CHAT_TEMPLATE = Path(__file__).resolve().parents[1] / "chat_templates" / "qwen3_5.jinja"
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
TOKEN_ID_FIELDS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")
TOWER = {
    "model_type": "qwen3_5_vision", "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
    "in_channels": 3, "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2,
    "num_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh", "initializer_range": 0.02,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
}  # fmt: skip
PIXEL_BUDGET = {"shortest_edge": (8 * 4) ** 2, "longest_edge": (32 * 4) ** 2}  # 8 x 8 .. 32 x 32 patches of 4 pixels
TOWER_SHARD = "model-visual.safetensors"


def _random_tower(specs, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """fp32: matrices N(0, 1 / fan_in), LayerNorm weights 1 + N(0, 0.1), biases N(0, 0.1), position table N(0, 0.5)."""
    out = {}
    for spec in specs:
        noise = torch.randn(spec.shape, generator=gen)
        if spec.name.endswith("pos_embed.weight"):
            out[spec.name] = noise * 0.5
        elif len(spec.shape) > 1:
            out[spec.name] = noise / float(np.prod(spec.shape[1:])) ** 0.5
        elif "norm" in spec.name and spec.name.endswith(".weight"):
            out[spec.name] = 1 + noise * 0.1
        else:
            out[spec.name] = noise * 0.1
    return out


def _calibration_images(seed: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((48, 64), (100, 40))]


def _scaled_tower(model_dir: Path, vision_cfg, target_std: float, seed: int) -> dict[str, torch.Tensor]:
    """The random tower with linear_fc2 (weight and bias) scaled so that its outputs' spread is `target_std`."""
    gen = torch.Generator().manual_seed(seed)
    weights = _random_tower(VisionTower.specs(vision_cfg), gen)
    processor = ImageProcessor.load(model_dir, vision_cfg)
    images = [processor.preprocess(im) for im in _calibration_images(seed)]
    spread = torch.cat(VisionTower(vision_cfg, weights).forward(images)).std().item()
    for suffix in ("weight", "bias"):
        weights[f"model.visual.merger.linear_fc2.{suffix}"] *= target_std / spread
    return weights


def _write_vision_configs(out: Path, hf: dict, vocab: int) -> None:
    """config.json's vision tower and token ids (the new tokens from `vocab` on), the preprocessor, the template."""
    for i, field in enumerate(TOKEN_ID_FIELDS):
        hf[field] = vocab + i
    hf["vision_config"] = {**TOWER, "out_hidden_size": hf["text_config"]["hidden_size"]}
    write_config(out, hf)
    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor",
        "size": PIXEL_BUDGET, "patch_size": TOWER["patch_size"], "temporal_patch_size": TOWER["temporal_patch_size"],
        "merge_size": TOWER["spatial_merge_size"], "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "resample": int(Image.Resampling.BICUBIC), "rescale_factor": 1 / 255,
    }  # fmt: skip
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    shutil.copyfile(CHAT_TEMPLATE, out / "chat_template.jinja")


def make_tiny_vision(out_dir: str | Path, source: str | Path = DEFAULT_SOURCE, seed: int = 0) -> Path:
    """Writes OUT_DIR (which must not exist yet, or be empty); returns it. Same source and seed, same files."""
    source, out = Path(source), Path(out_dir)
    if "text_config" not in json.loads((source / "config.json").read_text()):
        raise SystemExit(f"{source}: not a multimodal-layout checkpoint (config.json has no text_config)")
    tokens = [NewToken(t, special=True) for t in VISION_TOKENS]
    hf, weight_map = grow_checkpoint(source, out, tokens, random_rows(len(tokens)), seed,
                                     keep=lambda name: not name.startswith("model.visual."),
                                     rewritten=("chat_template.jinja",))  # fmt: skip
    vocab = hf["text_config"]["vocab_size"] - len(tokens)
    _write_vision_configs(out, hf, vocab)
    vision_cfg = ModelConfig.from_hf(hf).vision
    assert vision_cfg is not None

    embed = [n for n in weight_map if n.endswith("language_model.embed_tokens.weight")]
    if not embed:
        raise SystemExit(f"{source}: no model.language_model.embed_tokens.weight")
    with safe_open(str(out / weight_map[embed[0]]), "pt") as f:
        table = f.get_tensor(embed[0])
    tower = _scaled_tower(out, vision_cfg, table[:vocab].float().std().item(), seed)
    save_file({n: t.to(table.dtype).contiguous() for n, t in tower.items()}, str(out / TOWER_SHARD), {"format": "pt"})
    write_index(out, {**weight_map, **dict.fromkeys(tower, TOWER_SHARD)})
    return out


def main(argv: list[str] | None = None) -> None:
    grow_main(make_tiny_vision, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    main()

"""What the tests of the image input path (decoding, content parts, the server's front) share: an image-text model
directory without weights (config.json + tokenizer: all the front reads) and a stand-in for the checkpoint's image
processor. The processor itself (multimodal/image_processor.py) and the tower are tested against HF on their own;
the end-to-end tests use the real ones (unit_tests/vision_fixture.py)."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import AutoTokenizer

from lightllm_mtp.multimodal.image_input import ImageInput

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
TOKEN_ID_FIELDS = ("vision_start_token_id", "vision_end_token_id", "image_token_id")
CELL = 8  # pixels per language-model token side in the stand-in: 4-pixel patches, 2 x 2 merge
MAX_CELLS = 4


def image_text_config_dir(source: Path, out: Path) -> Path:
    """`source`'s config.json and tokenizer (a trained tiny text fixture) with the vision tokens added after its
    vocabulary, their ids in config.json and the vocabulary grown to hold them; no weights."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.save_pretrained(str(out))
    if (source / "chat_template.jinja").is_file():
        shutil.copyfile(source / "chat_template.jinja", out / "chat_template.jinja")
    hf = json.loads((source / "config.json").read_text())
    ids = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
    hf["text_config"]["vocab_size"] = max(ids) + 1
    hf.update(zip(TOKEN_ID_FIELDS, ids))
    (out / "config.json").write_text(json.dumps(hf, indent=1))
    return out


def stand_in_preprocess(image: Image.Image) -> ImageInput:
    """A deterministic image -> ImageInput of the tower's layout: the image resized to w x h cells of CELL pixels
    (1..MAX_CELLS each way, from its size), one token per cell, the patch values its pixels."""
    w, h = (min(MAX_CELLS, max(1, round(side / CELL))) for side in image.size)
    pixels = np.asarray(image.convert("RGB").resize((w * CELL, h * CELL)), dtype=np.float32) / 255
    patch = CELL // 2
    patches = pixels.reshape(h * 2, patch, w * 2, patch, 3).transpose(0, 2, 4, 1, 3).reshape(h * w * 4, -1)
    values = np.concatenate([patches, patches], axis=1)  # temporal patch 2: a still image is a frame pair
    return ImageInput.of(torch.from_numpy(values), (1, h * 2, w * 2), 2)


def noise_image(width: int = 24, height: int = 16, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def png_data_uri(image: Image.Image) -> str:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()

"""multimodal/image_processor.py against transformers' Qwen2VLImageProcessorPil, the processor qwen3_5 gets from
AutoImageProcessor where torchvision is not installed (as here: the torchvision variant, Qwen2VLImageProcessor,
differs only in its resize filter's implementation). Same pixel values (bit for bit) and patch grids."""

import numpy as np
import pytest
import torch
from PIL import Image

from lightllm_mtp.config.vision_config import VisionConfig
from lightllm_mtp.multimodal.image_processor import ImageProcessor, ImageTooElongatedError, smart_resize
from lightllm_mtp.multimodal.preprocessor_config import PreprocessorConfig

PUBLISHED = {"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16, "temporal_patch_size": 2,
             "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # fmt: skip
# a small budget (8 x 8 .. 32 x 32 patches of 4 pixels) with CLIP's mean / std, to exercise per-channel values
SMALL = {"size": {"shortest_edge": 32 * 32, "longest_edge": 128 * 128}, "patch_size": 4, "temporal_patch_size": 2,
         "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
         "image_std": [0.26862954, 0.26130258, 0.27577711]}  # fmt: skip


def vision_config(patch_size: int) -> VisionConfig:
    return VisionConfig(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3,
                        patch_size=patch_size, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                        out_hidden_size=64, hidden_act="gelu_pytorch_tanh", rope_theta=10000.0, image_token_id=1,
                        vision_start_token_id=2, vision_end_token_id=3, mrope_section=(2, 1, 1))  # fmt: skip


def processors(settings: dict):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    vision = vision_config(settings["patch_size"])
    return Qwen2VLImageProcessorPil(**settings), ImageProcessor(vision, PreprocessorConfig.from_hf(settings, vision))


def image(mode: str, width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    bands = {"RGB": 3, "RGBA": 4, "LA": 2, "L": 1, "P": 1, "CMYK": 4}[mode]
    values = rng.integers(0, 256, (height, width, bands), dtype=np.uint8)
    if mode in ("L", "P"):
        out = Image.fromarray(values[..., 0], "L")
        if mode == "P":
            out = out.convert("P")
            out.info["transparency"] = int(values[0, 0, 0])  # a palette image with a transparent colour
        return out
    return Image.frombytes(mode, (width, height), values.tobytes())


def assert_same(hf, ours, img):
    expected = hf(img, return_tensors="pt")
    got = ours.preprocess(img)
    assert got.grid_thw == tuple(expected["image_grid_thw"][0].tolist())
    assert got.pixel_values.dtype == torch.float32
    assert torch.equal(got.pixel_values, expected["pixel_values"])
    t, h, w = got.grid_thw
    assert got.num_tokens == t * h * w // 4
    assert ours.grid_thw(*img.size) == got.grid_thw and ours.num_tokens(*img.size) == got.num_tokens


@pytest.mark.parametrize("width, height", [(640, 480), (333, 517), (1024, 64), (40, 30), (7, 5), (2500, 1900)])
def test_published_settings_match_transformers(width, height):
    """Non-square, far below min_pixels (upscaled), a wide strip and above 256 x 256 patches' worth."""
    hf, ours = processors(PUBLISHED)
    assert_same(hf, ours, image("RGB", width, height))


@pytest.mark.parametrize("width, height", [(300, 200), (57, 33), (9, 9), (128, 128), (600, 20)])
def test_small_budget_matches_transformers(width, height):
    """The tiny fixture's budget (upscaled below 32 x 32 pixels, downscaled above 128 x 128), per-channel mean / std."""
    hf, ours = processors(SMALL)
    assert_same(hf, ours, image("RGB", width, height, seed=width))


@pytest.mark.parametrize("mode", ["RGBA", "LA", "L", "P", "CMYK"])
def test_modes_converted_as_transformers_does(mode):
    """Transparency composited onto white (alpha bands, a palette's transparent colour), the rest converted by PIL."""
    hf, ours = processors(SMALL)
    assert_same(hf, ours, image(mode, 70, 45, seed=3))


def test_transparent_pixels_become_white():
    _, ours = processors(SMALL)
    clear = Image.new("RGBA", (32, 32), (10, 200, 30, 0))
    expected = [(1.0 - m) / s for m, s in zip(SMALL["image_mean"], SMALL["image_std"])]
    patches = ours.preprocess(clear).pixel_values.view(64, 3, 2, 16)
    for c in range(3):
        assert torch.allclose(patches[:, c], torch.tensor(expected[c], dtype=torch.float32))


def test_patch_order_is_merge_windows():
    """An image whose pixel value is its patch index in raster order: the patches come out window by window."""
    _, ours = processors({**SMALL, "image_mean": [0, 0, 0], "image_std": [1, 1, 1]})
    h, w = 8, 12  # patches
    raster = np.arange(h * w).reshape(h, w).repeat(4, 0).repeat(4, 1).astype(np.uint8)
    got = ours.preprocess(Image.fromarray(raster).convert("RGB"))
    assert got.grid_thw == (1, h, w)
    first_values = (got.pixel_values[:, 0] * 255).round().long()
    order = [r * w + c for wr in range(h // 2) for wc in range(w // 2) for r in (2 * wr, 2 * wr + 1)
             for c in (2 * wc, 2 * wc + 1)]  # fmt: skip
    assert first_values.tolist() == order
    assert torch.equal(got.pixel_values.view(-1, 3, 2, 16)[:, :, 0], got.pixel_values.view(-1, 3, 2, 16)[:, :, 1])


def test_smart_resize_matches_transformers_and_refuses_elongated_images():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    for height, width in [(1, 1), (31, 17), (48, 80), (1000, 7), (4096, 4096), (5000, 3000), (112, 16)]:
        assert smart_resize(height, width, 32, 65536, 16777216) == hf_smart_resize(height, width, 32, 65536, 16777216)
        assert smart_resize(height, width, 8, 1024, 16384) == hf_smart_resize(height, width, 8, 1024, 16384)
    with pytest.raises(ImageTooElongatedError, match="200 times"):
        smart_resize(1, 201, 32, 65536, 16777216)
    _, ours = processors(SMALL)
    with pytest.raises(ImageTooElongatedError):
        ours.preprocess(Image.new("RGB", (402, 2)))

"""multimodal/preprocessor_config.py: the fields transformers' Qwen2VL processor reads, Qwen3.5's published values
when absent, and the settings it cannot honour refused by name."""

import json

import pytest
from PIL import Image

from lightllm_mtp.multimodal.preprocessor_config import (
    PreprocessorConfig,
    PreprocessorConfigError,
    load_preprocessor_config,
)
from unit_tests.multimodal.test_image_processor import vision_config

VISION = vision_config(16)


def test_absent_file_gives_the_published_qwen3_5_settings(tmp_path):
    cfg = load_preprocessor_config(tmp_path, VISION)
    assert (cfg.min_pixels, cfg.max_pixels) == (65536, 16777216)
    assert cfg.image_mean == cfg.image_std == (0.5, 0.5, 0.5)
    assert cfg.resample is Image.Resampling.BICUBIC and cfg.rescale_factor == 1 / 255


def test_fields_as_transformers_reads_them(tmp_path):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    raw = {"size": {"shortest_edge": 3136, "longest_edge": 1003520}, "min_pixels": 4096, "image_mean": 0.25,
           "image_std": [0.2, 0.3, 0.4], "resample": 2, "rescale_factor": 0.5, "patch_size": 16}  # fmt: skip
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(raw))
    cfg = load_preprocessor_config(tmp_path, VISION)
    hf = Qwen2VLImageProcessorPil(**raw)
    assert (cfg.min_pixels, cfg.max_pixels) == (hf.size["shortest_edge"], hf.size["longest_edge"]) == (4096, 1003520)
    assert cfg.image_mean == (0.25, 0.25, 0.25) and cfg.image_std == (0.2, 0.3, 0.4)
    assert cfg.resample is Image.Resampling.BILINEAR and cfg.rescale_factor == 0.5


@pytest.mark.parametrize("raw, message", [
    ({"patch_size": 14}, "'patch_size' = 14 differs from the vision tower's 16"),
    ({"merge_size": 4}, "'merge_size'"),
    ({"temporal_patch_size": 1}, "'temporal_patch_size'"),
    ({"do_resize": False}, "'do_resize' = False is not supported"),
    ({"do_normalize": False}, "'do_normalize'"),
    ({"size": {"shortest_edge": 100, "longest_edge": 50}}, "min pixels 100 > max pixels 50"),
    ({"max_pixels": -1}, "'max_pixels'"),
    ({"image_mean": [0.5, 0.5]}, "'image_mean' must be 3 numbers"),
    ({"image_std": [0.5, 0.0, 0.5]}, "must be positive"),
    ({"resample": 99}, "'resample' 99"),
    ({"rescale_factor": "x"}, "'rescale_factor'"),
])  # fmt: skip
def test_unsupported_settings_are_refused(raw, message):
    with pytest.raises(PreprocessorConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PreprocessorConfig.from_hf(raw, VISION)


def test_unreadable_file_is_named(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(PreprocessorConfigError, match="preprocessor_config.json: not a JSON file"):
        load_preprocessor_config(tmp_path, VISION)

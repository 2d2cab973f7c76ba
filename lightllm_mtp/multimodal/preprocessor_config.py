"""A checkpoint's `preprocessor_config.json` (the image half), parsed once: the pixel budget, resampling filter and
normalization of Qwen's image processor (transformers' Qwen2VLImageProcessor, which qwen3_5 / qwen3_vl use).

The published Qwen3.5 / Qwen3-VL checkpoints ship `size = {"shortest_edge": 65536, "longest_edge": 16777216}`
(the min / max pixel counts of the resized image), patch 16, temporal patch 2, merge 2 and mean = std = 0.5 per
channel; those are the defaults here when the file, or a field of it, is absent. The older spellings `min_pixels` /
`max_pixels` override `size` as transformers' processor lets them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from lightllm_mtp.config.vision_config import VisionConfig

PREPROCESSOR_FILE = "preprocessor_config.json"
QWEN3_5_MIN_PIXELS = 65536  # 256 x 256: 16 x 16 patches of 16 pixels
QWEN3_5_MAX_PIXELS = 16777216  # 4096 x 4096
QWEN3_5_MEAN = (0.5, 0.5, 0.5)
QWEN3_5_STD = (0.5, 0.5, 0.5)
# fields that switch a processing step off: every published checkpoint leaves them on; off is refused, not ignored
_ALWAYS_ON = ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")


class PreprocessorConfigError(ValueError):
    pass


@dataclass(frozen=True)
class PreprocessorConfig:
    min_pixels: int  # the resized image holds at least this many pixels ...
    max_pixels: int  # ... and at most this many
    image_mean: tuple[float, ...]  # per channel, after rescaling to [0, 1]
    image_std: tuple[float, ...]
    rescale_factor: float = 1 / 255
    resample: Image.Resampling = Image.Resampling.BICUBIC

    @classmethod
    def from_hf(cls, raw: dict[str, Any], vision: VisionConfig) -> "PreprocessorConfig":
        for key in _ALWAYS_ON:
            if raw.get(key, True) is not True:
                raise PreprocessorConfigError(f"{PREPROCESSOR_FILE}: '{key}' = {raw[key]!r} is not supported")
        for key, want in (("patch_size", vision.patch_size), ("temporal_patch_size", vision.temporal_patch_size),
                          ("merge_size", vision.spatial_merge_size)):  # fmt: skip
            if raw.get(key, want) != want:
                raise PreprocessorConfigError(f"{PREPROCESSOR_FILE}: '{key}' = {raw[key]!r} differs from the vision "
                                              f"tower's {want}")  # fmt: skip
        size = raw.get("size") or {}
        if not isinstance(size, dict):
            raise PreprocessorConfigError(f"{PREPROCESSOR_FILE}: 'size' must be an object, got {size!r}")
        min_pixels = _positive_int(raw, "min_pixels", size.get("shortest_edge", QWEN3_5_MIN_PIXELS))
        max_pixels = _positive_int(raw, "max_pixels", size.get("longest_edge", QWEN3_5_MAX_PIXELS))
        if min_pixels > max_pixels:
            raise PreprocessorConfigError(f"{PREPROCESSOR_FILE}: min pixels {min_pixels} > max pixels {max_pixels}")
        channels = vision.in_channels
        mean = _per_channel(raw, "image_mean", QWEN3_5_MEAN, channels)
        std = _per_channel(raw, "image_std", QWEN3_5_STD, channels)
        if any(s <= 0 for s in std):
            raise PreprocessorConfigError(f"{PREPROCESSOR_FILE}: 'image_std' {list(std)} must be positive")
        factor = raw.get("rescale_factor", 1 / 255)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
            raise PreprocessorConfigError(f"{PREPROCESSOR_FILE}: 'rescale_factor' must be a positive number")
        try:
            resample = Image.Resampling(raw.get("resample", Image.Resampling.BICUBIC))
        except ValueError:
            raise PreprocessorConfigError(f"{PREPROCESSOR_FILE}: 'resample' {raw['resample']!r} is not a PIL "
                                          "resampling filter") from None  # fmt: skip
        return cls(min_pixels, max_pixels, mean, std, float(factor), resample)


def load_preprocessor_config(model_dir: str | Path, vision: VisionConfig) -> PreprocessorConfig:
    """The checkpoint's `preprocessor_config.json`, or Qwen3.5's published values when it has none."""
    path = Path(model_dir) / PREPROCESSOR_FILE
    if not path.is_file():
        return PreprocessorConfig.from_hf({}, vision)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PreprocessorConfigError(f"{path}: not a JSON file ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict):
        raise PreprocessorConfigError(f"{path}: must hold a JSON object")
    return PreprocessorConfig.from_hf(raw, vision)


def _positive_int(raw: dict[str, Any], key: str, default: Any) -> int:
    value = raw.get(key)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PreprocessorConfigError(f"{PREPROCESSOR_FILE}: '{key}' (or its 'size' entry) must be a positive "
                                      f"integer, got {value!r}")  # fmt: skip
    return value


def _per_channel(raw: dict[str, Any], key: str, default: tuple[float, ...], channels: int) -> tuple[float, ...]:
    value = raw.get(key, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * channels
    if (not isinstance(value, (list, tuple)) or len(value) != channels
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):  # fmt: skip
        raise PreprocessorConfigError(f"{PREPROCESSOR_FILE}: '{key}' must be {channels} numbers, got {value!r}")
    return tuple(float(v) for v in value)

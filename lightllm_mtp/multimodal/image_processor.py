"""One PIL image -> the vision tower's input (`ImageInput`), as transformers' Qwen2VLImageProcessor (its PIL
backend, which qwen3_5 uses when torchvision is absent) computes it:

1. RGB: an image with transparency (an alpha band, or a palette / L image with a transparent colour) is composited
   onto white; any other mode is converted by PIL.
2. `smart_resize`: each side rounded to a multiple of patch x merge (32 pixels at the published shapes), then
   the pixel count scaled (keeping the aspect ratio) into [min_pixels, max_pixels]; PIL's bicubic filter.
3. Rescale by 1/255 (in float64, stored as float32), normalize by the per-channel mean / std (float32).
4. Patches of patch x patch pixels, each repeated `temporal_patch_size` times (a still image is one frame pair),
   flattened as (channel, temporal, row, column); patches ordered by 2 x 2 merge window: windows in raster order,
   the 4 patches of a window in raster order inside it, so every language-model token's patches are adjacent.

(transformers' torchvision backend, Qwen2VLImageProcessor, resizes with torch's antialiased bicubic instead of PIL's:
on random images its resized pixels differ by 1 or 2 of 255 levels on under 1% of the pixels; everything else is the
same.)"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lightllm_mtp.config.vision_config import VisionConfig
from lightllm_mtp.multimodal.image_input import ImageInput
from lightllm_mtp.multimodal.preprocessor_config import PreprocessorConfig, load_preprocessor_config

MAX_ASPECT_RATIO = 200


class ImageTooElongatedError(ValueError):
    pass


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) after resizing: multiples of `factor`, the pixel count within [min_pixels, max_pixels] (as
    far as the rounding allows), the aspect ratio kept as closely as possible. Rounds as transformers does
    (Python's round: halves to even)."""
    if max(height, width) > MAX_ASPECT_RATIO * min(height, width):
        raise ImageTooElongatedError(f"image of {width} x {height} pixels: the longer side may be at most "
                                     f"{MAX_ASPECT_RATIO} times the shorter")  # fmt: skip
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / shrink / factor) * factor)
        w = max(factor, math.floor(width / shrink / factor) * factor)
    elif h * w < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * grow / factor) * factor
        w = math.ceil(width * grow / factor) * factor
    return h, w


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, transparency composited onto white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


class ImageProcessor:
    def __init__(self, vision: VisionConfig, config: PreprocessorConfig):
        self.vision = vision
        self.config = config
        self.factor = vision.patch_size * vision.spatial_merge_size  # the resized sides are multiples of this
        self._mean = np.asarray(config.image_mean, dtype=np.float32)[:, None, None]
        self._std = np.asarray(config.image_std, dtype=np.float32)[:, None, None]

    @classmethod
    def load(cls, model_dir: str | Path, vision: VisionConfig) -> "ImageProcessor":
        """With the checkpoint's preprocessor_config.json (Qwen3.5's published settings when it has none)."""
        return cls(vision, load_preprocessor_config(model_dir, vision))

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of an image of this size after resizing."""
        h, w = smart_resize(height, width, self.factor, self.config.min_pixels, self.config.max_pixels)
        return w, h

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """The patch grid (before merging) of an image of this size, without processing it."""
        w, h = self.resized_size(width, height)
        return 1, h // self.vision.patch_size, w // self.vision.patch_size

    def num_tokens(self, width: int, height: int) -> int:
        """Language-model tokens of an image of this size."""
        t, h, w = self.grid_thw(width, height)
        return t * h * w // self.vision.merge_unit

    def preprocess(self, image: Image.Image) -> ImageInput:
        rgb = to_rgb(image)
        if rgb.width < 1 or rgb.height < 1:
            raise ValueError(f"image of {rgb.width} x {rgb.height} pixels is empty")
        resized = rgb.resize(self.resized_size(rgb.width, rgb.height), resample=self.config.resample)
        pixels = np.asarray(resized).transpose(2, 0, 1)  # [3, H, W] uint8
        pixels = (pixels.astype(np.float64) * self.config.rescale_factor).astype(np.float32)
        pixels = (pixels - self._mean) / self._std
        patches, grid = self._patchify(pixels)
        return ImageInput.of(torch.from_numpy(patches), grid, self.vision.spatial_merge_size)

    def _patchify(self, pixels: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        """[C, H, W] -> ([h * w patches in merge-window order, C * temporal * patch * patch], (1, h, w))."""
        p, m, tp = self.vision.patch_size, self.vision.spatial_merge_size, self.vision.temporal_patch_size
        c, height, width = pixels.shape
        h, w = height // p, width // p
        # [C, window row, row in window, pixel row, window col, col in window, pixel col]
        blocks = pixels.reshape(c, h // m, m, p, w // m, m, p)
        # -> [window row, window col, row in window, col in window, C, pixel row, pixel col]
        blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)
        frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], tp, p, p))
        return np.ascontiguousarray(frames).reshape(h * w, c * tp * p * p), (1, h, w)

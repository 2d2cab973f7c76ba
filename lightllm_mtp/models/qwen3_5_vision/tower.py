"""Qwen3.5's vision tower (`model.visual.*`): preprocessed images -> one embedding per language-model token.

patch embedding (a Conv3d whose stride is its kernel: one matmul over each flattened patch) + the learned position
table resampled onto each image's grid -> `depth` blocks (vision/block.py; 2D rotary, attention within each frame)
-> merger: LayerNorm, each 2 x 2 merge window's 4 patches concatenated, linear_fc1, GELU, linear_fc2 to the text
model's hidden size. No deepstack. The tower is never quantized: it loads in the model dtype whatever the
checkpoint's quantization_config says about the language model (its tensors carry no FP8 scales; one that did is
refused by the loader, named)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from lightllm_mtp.common.tensor_spec import TensorSpec
from lightllm_mtp.common.weight_loader import load_weights
from lightllm_mtp.config.quant_config import quant_config_of
from lightllm_mtp.config.runtime import LoadFormat
from lightllm_mtp.config.vision_config import VisionConfig
from lightllm_mtp.models.qwen3_5_vision.block import (
    LAYER_NORM_EPS,
    VisionBlock,
    layer_norm_specs,
    linear_specs,
    segment_batches,
)
from lightllm_mtp.models.qwen3_5_vision.grid import GridTables, grid_tables
from lightllm_mtp.multimodal.image_input import ImageInput

PREFIX = "model.visual."


class VisionTower:
    def __init__(self, cfg: VisionConfig, weights: dict[str, torch.Tensor]):
        """weights: checkpoint name -> tensor, as `load` reads them (every spec of `specs(cfg)`)."""
        self.cfg = cfg
        p = PREFIX
        patch = weights[f"{p}patch_embed.proj.weight"]
        self.dtype, self.device = patch.dtype, patch.device
        self.patch_embed = (patch.reshape(cfg.hidden_size, cfg.patch_dim), weights[f"{p}patch_embed.proj.bias"])
        self.pos_table = weights[f"{p}pos_embed.weight"]  # [side * side, hidden]
        self.side = int(round(cfg.num_position_embeddings**0.5))
        self.blocks = [VisionBlock(cfg, weights, f"{p}blocks.{i}.") for i in range(cfg.depth)]
        self.merger_norm = (weights[f"{p}merger.norm.weight"], weights[f"{p}merger.norm.bias"])
        self.merger_fc1 = (weights[f"{p}merger.linear_fc1.weight"], weights[f"{p}merger.linear_fc1.bias"])
        self.merger_fc2 = (weights[f"{p}merger.linear_fc2.weight"], weights[f"{p}merger.linear_fc2.bias"])
        half = cfg.head_dim // 2  # each of the h and w angles rotates a quarter of head_dim's pairs
        exponents = torch.arange(0, half, 2, dtype=torch.float32) / half
        self.inv_freq = (1.0 / cfg.rope_theta**exponents).to(self.device)

    @staticmethod
    def specs(cfg: VisionConfig) -> list[TensorSpec]:
        """Every tensor of the tower, full shapes (replicated on every tp rank), never quantizable."""
        p, d = PREFIX, cfg.hidden_size
        window = d * cfg.merge_unit
        kernel = (cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        specs = [TensorSpec(f"{p}patch_embed.proj.weight", (d, *kernel)), TensorSpec(f"{p}patch_embed.proj.bias", (d,)),
                 TensorSpec(f"{p}pos_embed.weight", (cfg.num_position_embeddings, d))]  # fmt: skip
        for i in range(cfg.depth):
            specs += VisionBlock.specs(cfg, f"{p}blocks.{i}.")
        return (specs + layer_norm_specs(f"{p}merger.norm", d) + linear_specs(f"{p}merger.linear_fc1", window, window)
                + linear_specs(f"{p}merger.linear_fc2", cfg.out_hidden_size, window))  # fmt: skip

    @classmethod
    def load(cls, model_dir: str | Path | None, cfg: VisionConfig, dtype: torch.dtype, device: torch.device | str,
             load_format: LoadFormat = LoadFormat.AUTO, seed: int = 0) -> "VisionTower":  # fmt: skip
        """The tower of a checkpoint, through the one loader (LoadFormat.DUMMY: random weights of its shapes). The
        checkpoint's quantization_config is passed only so that the loader accepts the language model's FP8 scales
        in the shards; no tower tensor is FP8 and none is quantized online."""
        quant = None
        config = Path(model_dir) / "config.json" if model_dir is not None else None
        if config is not None and config.is_file() and load_format is LoadFormat.AUTO:
            quant = quant_config_of(json.loads(config.read_text()))
        weights = load_weights(model_dir, cls.specs(cfg), dtype, device, load_format, seed=seed, quant=quant)
        return cls(cfg, weights)

    @torch.inference_mode()
    def forward(self, images: list[ImageInput]) -> list[torch.Tensor]:
        """Each image's token embeddings [num_tokens, out_hidden_size] in the model dtype, in its tokens' order
        (merge windows in raster order); all images in one pass, attention kept within each image's frames."""
        if not images:
            return []
        for image in images:
            if image.merge_size != self.cfg.spatial_merge_size or image.pixel_values.shape[1] != self.cfg.patch_dim:
                raise ValueError(f"image of {tuple(image.pixel_values.shape)} patches, merge {image.merge_size}: "
                                 f"this tower takes {self.cfg.patch_dim} values a patch, merge "
                                 f"{self.cfg.spatial_merge_size}")  # fmt: skip
        tables = grid_tables([im.grid_thw for im in images], self.cfg.spatial_merge_size, self.side)
        pixels = torch.cat([im.pixel_values for im in images]).to(self.device, non_blocking=True).to(self.dtype)
        x = F.linear(pixels, *self.patch_embed) + self._position_embeddings(tables)
        cos, sin = self._rotary(tables)
        batches = segment_batches(tables.segments, self.device)
        for block in self.blocks:
            x = block.forward(x, cos, sin, batches)
        x = F.layer_norm(x, (self.cfg.hidden_size,), *self.merger_norm, eps=LAYER_NORM_EPS)
        x = x.view(-1, self.cfg.hidden_size * self.cfg.merge_unit)  # a merge window's 4 patches are adjacent
        x = F.linear(F.gelu(F.linear(x, *self.merger_fc1)), *self.merger_fc2)
        return list(x.split([im.num_tokens for im in images]))

    def _position_embeddings(self, tables: GridTables) -> torch.Tensor:
        """[N, hidden]: each patch's 4 position-table rows, weighted in fp32, in the model dtype."""
        taps = tables.pos_taps.to(self.device, non_blocking=True)
        weights = tables.pos_weights.to(self.device, non_blocking=True)
        return (self.pos_table[taps] * weights[:, :, None]).sum(1).to(self.dtype)

    def _rotary(self, tables: GridTables) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, head_dim] fp32: the row angles on the first quarter of each half of head_dim, the column
        angles on the second."""
        rows = tables.rows.to(self.device, non_blocking=True)[:, None] * self.inv_freq
        cols = tables.cols.to(self.device, non_blocking=True)[:, None] * self.inv_freq
        angles = torch.cat([rows, cols, rows, cols], dim=-1)
        return angles.cos(), angles.sin()

"""The vision tower's configuration (`vision_config` of a Qwen3.5 image-text checkpoint) and the text model's
multimodal fields: the image token ids and the interleaved M-RoPE sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class VisionConfigError(ValueError):
    pass


# transformers' Qwen3_5VisionConfig / Qwen3_5Config defaults, which apply to a field the checkpoint leaves out
_HF_DEFAULTS = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
                "num_position_embeddings": 2304, "image_token_id": 248056, "vision_start_token_id": 248053,
                "vision_end_token_id": 248054}  # fmt: skip


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    num_position_embeddings: int  # the learned position table's rows (a square grid: 48 x 48 at the published shapes)
    out_hidden_size: int  # the merger's output: the text model's hidden size
    hidden_act: str
    rope_theta: float
    # the text side
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    mrope_section: tuple[int, ...]  # frequency pairs taken from t / h / w positions (interleaved)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merge_unit(self) -> int:
        """Patches per language-model token (2 x 2)."""
        return self.spatial_merge_size**2

    @property
    def patch_dim(self) -> int:
        """One patch's values: channels x temporal patch x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


def _field(cfg: dict[str, Any], key: str, kind: type = int, default: Any = None) -> Any:
    value = cfg.get(key, default)
    if value is None:
        raise VisionConfigError(f"vision_config: missing required field '{key}'")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise VisionConfigError(f"vision_config: field '{key}' must be {kind.__name__}, got {value!r}")
    return value


def parse_vision_config(hf: dict[str, Any], text: dict[str, Any], text_hidden: int,
                        rotary_dim: int) -> VisionConfig | None:  # fmt: skip
    """The checkpoint's vision tower, or None for a text-only checkpoint (no `vision_config`)."""
    vision = hf.get("vision_config")
    if vision is None:
        return None
    if not isinstance(vision, dict):
        raise VisionConfigError("'vision_config' must be an object")
    if vision.get("deepstack_visual_indexes"):
        raise VisionConfigError("vision_config: deepstack mergers ('deepstack_visual_indexes') are not supported "
                                "(Qwen3.5 has none)")  # fmt: skip
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = tuple(rope.get("mrope_section") or (rotary_dim // 2,))
    if sum(section) != rotary_dim // 2 or len(section) > 3:
        raise VisionConfigError(f"'mrope_section' {list(section)} must have at most 3 entries summing to the rotary "
                                f"dim / 2 = {rotary_dim // 2}")  # fmt: skip
    if rope.get("mrope_interleaved", True) is not True:
        raise VisionConfigError("'mrope_interleaved' = false (sectioned M-RoPE) is not supported; Qwen3.5 interleaves")
    vision_rope = vision.get("rope_parameters") or {}
    d = _HF_DEFAULTS
    cfg = VisionConfig(
        depth=_field(vision, "depth", default=d["depth"]),
        hidden_size=_field(vision, "hidden_size", default=d["hidden_size"]),
        intermediate_size=_field(vision, "intermediate_size", default=d["intermediate_size"]),
        num_heads=_field(vision, "num_heads", default=d["num_heads"]),
        in_channels=_field(vision, "in_channels", default=3),
        patch_size=_field(vision, "patch_size", default=d["patch_size"]),
        temporal_patch_size=_field(vision, "temporal_patch_size", default=2),
        spatial_merge_size=_field(vision, "spatial_merge_size", default=2),
        num_position_embeddings=_field(vision, "num_position_embeddings", default=d["num_position_embeddings"]),
        out_hidden_size=_field(vision, "out_hidden_size", default=text_hidden),
        hidden_act=_field(vision, "hidden_act", str, default="gelu_pytorch_tanh"),
        rope_theta=_field(vision_rope, "rope_theta", float, default=10000.0),
        image_token_id=_field(hf, "image_token_id", default=d["image_token_id"]),
        vision_start_token_id=_field(hf, "vision_start_token_id", default=d["vision_start_token_id"]),
        vision_end_token_id=_field(hf, "vision_end_token_id", default=d["vision_end_token_id"]),
        mrope_section=section,
    )
    if cfg.out_hidden_size != text_hidden:
        raise VisionConfigError(f"vision_config: 'out_hidden_size' {cfg.out_hidden_size} must equal the text "
                                f"model's hidden size {text_hidden}")  # fmt: skip
    if cfg.hidden_size % cfg.num_heads:
        raise VisionConfigError(f"vision_config: 'hidden_size' {cfg.hidden_size} is not a multiple of 'num_heads' "
                                f"{cfg.num_heads}")  # fmt: skip
    side = int(round(cfg.num_position_embeddings**0.5))
    if side * side != cfg.num_position_embeddings:
        raise VisionConfigError(f"vision_config: 'num_position_embeddings' {cfg.num_position_embeddings} is not a "
                                "square grid")  # fmt: skip
    if cfg.hidden_act not in ("gelu_pytorch_tanh", "gelu"):
        raise VisionConfigError(f"vision_config: 'hidden_act' {cfg.hidden_act!r} is not supported")
    return cfg

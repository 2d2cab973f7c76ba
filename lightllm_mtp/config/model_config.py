"""HF config.json -> frozen ModelConfig, parsed once.

Accepts the published multimodal wrapper (Qwen3_5ForConditionalGeneration /
Qwen3_5MoeForConditionalGeneration, language-model fields under `text_config`) and the flat text config
(Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from lightllm_mtp.config.rope_scaling import RopeScaling, RopeScalingError, merge_override, parse_rope_scaling
from lightllm_mtp.config.quant_config import QuantConfig, QuantConfigError, quant_config_of
from lightllm_mtp.config.vision_config import VisionConfig, VisionConfigError, parse_vision_config


class ModelConfigError(ValueError):
    """A config.json that this engine cannot serve; the message names the offending field."""


def missing_model_dir_message(model_dir: str) -> str:
    """A model directory that does not exist; a hub id ("Qwen/Qwen3.5-27B") gets told how to fetch it, since this
    engine loads local checkpoints only."""
    message = f"model directory {model_dir!r} does not exist: a local checkpoint directory is expected"
    parts = model_dir.split("/")
    if len(parts) == 2 and all(parts) and not model_dir.startswith((".", "~")):
        message += (f" ({model_dir!r} looks like a Hugging Face hub id: download it first, e.g. "
                    f"`huggingface-cli download {model_dir} --local-dir DIR`, then pass DIR)")
    return message


class ModelType(Enum):
    QWEN3_5 = "qwen3_5"
    QWEN3_5_MOE = "qwen3_5_moe"


class LayerType(Enum):
    LINEAR_ATTENTION = "linear_attention"
    FULL_ATTENTION = "full_attention"


# architecture name -> (model type, weights live under model.language_model.)
SUPPORTED_ARCHITECTURES: dict[str, tuple[ModelType, bool]] = {
    "Qwen3_5ForConditionalGeneration": (ModelType.QWEN3_5, True),
    "Qwen3_5MoeForConditionalGeneration": (ModelType.QWEN3_5_MOE, True),
    "Qwen3_5ForCausalLM": (ModelType.QWEN3_5, False),
    "Qwen3_5MoeForCausalLM": (ModelType.QWEN3_5_MOE, False),
}
_MODEL_TYPES: dict[str, tuple[ModelType, bool]] = {
    "qwen3_5": (ModelType.QWEN3_5, True),
    "qwen3_5_moe": (ModelType.QWEN3_5_MOE, True),
    "qwen3_5_text": (ModelType.QWEN3_5, False),
    "qwen3_5_moe_text": (ModelType.QWEN3_5_MOE, False),
}


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int


@dataclass(frozen=True)
class ModelConfig:
    model_type: ModelType
    architecture: str
    weight_prefix: str  # "model.language_model." (wrapper) or "model." (flat text checkpoint)
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[LayerType, ...]
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    # gated full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    rope_scaling: RopeScaling | None  # None: plain RoPE (rope_type 'default')
    attn_output_gate: bool
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # feed-forward: dense (intermediate_size) or MoE
    intermediate_size: int | None
    moe: MoEConfig | None
    mtp_num_hidden_layers: int
    eos_token_ids: tuple[int, ...]
    torch_dtype: str | None
    quantization: QuantConfig | None = None  # the checkpoint's quantization_config (FP8 block weights)
    vision: VisionConfig | None = None  # the vision tower (image-text checkpoints); None: text only

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t is LayerType.FULL_ATTENTION)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t is LayerType.LINEAR_ATTENTION)

    @property
    def max_context_len(self) -> int:
        """The longest request the model's positions serve: the scaled window (factor x the original one) with RoPE
        scaling, else max_position_embeddings."""
        return self.rope_scaling.max_positions if self.rope_scaling is not None else self.max_position_embeddings

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, rope_scaling: dict[str, Any] | None = None) -> "ModelConfig":
        """rope_scaling: the engine's override of the checkpoint's RoPE scaling (config/rope_scaling.py)."""
        path = Path(model_dir) / "config.json"
        if not Path(model_dir).is_dir():
            raise ModelConfigError(missing_model_dir_message(str(model_dir)))
        if not path.is_file():
            raise ModelConfigError(f"{path}: config.json not found")
        try:
            with open(path) as f:
                hf = json.load(f)
        except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ModelConfigError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(hf, dict):
            raise ModelConfigError(f"{path}: the top level must be a JSON object")
        try:
            return cls.from_hf(hf, rope_scaling)
        except ModelConfigError as e:
            raise ModelConfigError(f"{path}: {e}") from e

    @classmethod
    def from_hf(cls, hf: dict[str, Any], rope_scaling: dict[str, Any] | None = None) -> "ModelConfig":
        model_type, wrapped, architecture = _resolve_architecture(hf)
        text = hf.get("text_config") if wrapped else hf
        if not isinstance(text, dict):
            raise ModelConfigError(f"'text_config' must be an object for architecture {architecture}")
        return _parse_text_config(text, hf, model_type, wrapped, architecture, rope_scaling)


def _resolve_architecture(hf: dict[str, Any]) -> tuple[ModelType, bool, str]:
    archs = hf.get("architectures") or []
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            model_type, wrapped = SUPPORTED_ARCHITECTURES[arch]
            return model_type, wrapped, arch
    if archs:
        raise ModelConfigError(
            f"unsupported 'architectures' {archs}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    mt = hf.get("model_type")
    if mt in _MODEL_TYPES:
        model_type, wrapped = _MODEL_TYPES[mt]
        return model_type, wrapped, mt
    raise ModelConfigError(f"unsupported 'model_type' {mt!r}; supported: {sorted(_MODEL_TYPES)}")


def _require(cfg: dict[str, Any], key: str, kind: type = int) -> Any:
    if key not in cfg:
        raise ModelConfigError(f"missing required field '{key}'")
    value = cfg[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ModelConfigError(f"field '{key}' must be {kind.__name__}, got {value!r}")
    return value


def _layer_types(text: dict[str, Any], num_layers: int) -> tuple[LayerType, ...]:
    raw = text.get("layer_types")
    if raw is None:
        interval = text.get("full_attention_interval", 4)
        if not isinstance(interval, int) or interval < 1:
            raise ModelConfigError(f"field 'full_attention_interval' must be a positive int, got {interval!r}")
        return tuple(
            LayerType.FULL_ATTENTION if (i + 1) % interval == 0 else LayerType.LINEAR_ATTENTION
            for i in range(num_layers)
        )
    if len(raw) != num_layers:
        raise ModelConfigError(f"field 'layer_types' has {len(raw)} entries, 'num_hidden_layers' is {num_layers}")
    try:
        return tuple(LayerType(t) for t in raw)
    except ValueError as e:
        raise ModelConfigError(f"field 'layer_types': {e}; allowed {[t.value for t in LayerType]}") from None


def _rope(text: dict[str, Any], head_dim: int, override: dict[str, Any] | None,
          max_position_embeddings: int) -> tuple[int, float, RopeScaling | None]:  # fmt: skip
    rope = merge_override(text.get("rope_parameters") or text.get("rope_scaling") or {}, override)
    where = "the rope_scaling option" if override is not None else "field 'rope_parameters'"
    try:
        scaling = parse_rope_scaling(rope, max_position_embeddings, text.get("original_max_position_embeddings"))
    except RopeScalingError as e:
        raise ModelConfigError(f"{where}: {e}") from None
    theta = rope.get("rope_theta", text.get("rope_theta", 10000.0))
    factor = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    rotary_dim = int(head_dim * factor)
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ModelConfigError(f"field 'partial_rotary_factor' = {factor} gives an invalid rotary dim {rotary_dim}")
    return rotary_dim, float(theta), scaling


def _eos_ids(text: dict[str, Any], hf: dict[str, Any]) -> tuple[int, ...]:
    eos = text.get("eos_token_id", hf.get("eos_token_id"))
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _parse_text_config(
    text: dict[str, Any], hf: dict[str, Any], model_type: ModelType, wrapped: bool, architecture: str,
    rope_override: dict[str, Any] | None = None,
) -> ModelConfig:
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"field 'hidden_act' = {act!r} is not supported (only 'silu')")
    num_layers = _require(text, "num_hidden_layers")
    head_dim = text.get("head_dim") or _require(text, "hidden_size") // _require(text, "num_attention_heads")
    max_positions = int(text.get("max_position_embeddings", 262144))
    rotary_dim, theta, rope_scaling = _rope(text, head_dim, rope_override, max_positions)
    moe = None
    intermediate = None
    if model_type is ModelType.QWEN3_5_MOE:
        moe = MoEConfig(
            num_experts=_require(text, "num_experts"),
            num_experts_per_tok=_require(text, "num_experts_per_tok"),
            moe_intermediate_size=_require(text, "moe_intermediate_size"),
            shared_expert_intermediate_size=_require(text, "shared_expert_intermediate_size"),
        )
        if text.get("norm_topk_prob", True) is not True:
            raise ModelConfigError("field 'norm_topk_prob' = false is not supported (Qwen3.5 always renormalises)")
    else:
        intermediate = _require(text, "intermediate_size")
    tie = text.get("tie_word_embeddings", hf.get("tie_word_embeddings", False))
    try:
        quantization = quant_config_of(hf)
    except QuantConfigError as e:
        raise ModelConfigError(str(e)) from None
    cfg = ModelConfig(
        model_type=model_type,
        architecture=architecture,
        weight_prefix="model.language_model." if wrapped else "model.",
        vocab_size=_require(text, "vocab_size"),
        hidden_size=_require(text, "hidden_size"),
        num_hidden_layers=num_layers,
        layer_types=_layer_types(text, num_layers),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=max_positions,
        tie_word_embeddings=bool(tie),
        num_attention_heads=_require(text, "num_attention_heads"),
        num_key_value_heads=_require(text, "num_key_value_heads"),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        rope_scaling=rope_scaling,
        attn_output_gate=bool(text.get("attn_output_gate", True)),
        linear_num_key_heads=_require(text, "linear_num_key_heads"),
        linear_num_value_heads=_require(text, "linear_num_value_heads"),
        linear_key_head_dim=_require(text, "linear_key_head_dim"),
        linear_value_head_dim=_require(text, "linear_value_head_dim"),
        linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
        intermediate_size=intermediate,
        moe=moe,
        mtp_num_hidden_layers=int(text.get("mtp_num_hidden_layers", 0)),
        eos_token_ids=_eos_ids(text, hf),
        torch_dtype=text.get("dtype", text.get("torch_dtype", hf.get("dtype", hf.get("torch_dtype")))),
        quantization=quantization,
    )
    _validate(cfg)
    try:
        vision = parse_vision_config(hf, text, cfg.hidden_size, rotary_dim) if wrapped else None
    except VisionConfigError as e:
        raise ModelConfigError(str(e)) from None
    if vision is not None and not max(vision.image_token_id, vision.vision_start_token_id,
                                      vision.vision_end_token_id) < cfg.vocab_size:  # fmt: skip
        vision = None  # image token ids outside the vocabulary (a text-only fixture with a placeholder tower config)
    return dataclasses.replace(cfg, vision=vision) if vision is not None else cfg


def _validate(cfg: ModelConfig) -> None:
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ModelConfigError(
            f"field 'num_attention_heads' ({cfg.num_attention_heads}) must be a multiple of "
            f"'num_key_value_heads' ({cfg.num_key_value_heads})"
        )
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ModelConfigError(
            f"field 'linear_num_value_heads' ({cfg.linear_num_value_heads}) must be a multiple of "
            f"'linear_num_key_heads' ({cfg.linear_num_key_heads})"
        )
    if cfg.linear_conv_kernel_dim < 2:
        raise ModelConfigError(f"field 'linear_conv_kernel_dim' must be >= 2, got {cfg.linear_conv_kernel_dim}")
    if cfg.moe is not None and not 0 < cfg.moe.num_experts_per_tok <= cfg.moe.num_experts:
        raise ModelConfigError("field 'num_experts_per_tok' must be in [1, num_experts]")
    if cfg.mtp_num_hidden_layers < 0:
        raise ModelConfigError("field 'mtp_num_hidden_layers' must be >= 0")

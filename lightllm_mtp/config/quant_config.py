"""A checkpoint's `quantization_config` (config.json), parsed once.

The published Qwen3.5 -FP8 checkpoints (and transformers' `FineGrainedFP8Config`, quant_method "fp8") declare
`{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
"modules_to_not_convert": [...]}`. Which tensors are FP8 is decided per tensor by the loader: exactly those with a
`<name>_scale_inv` sidecar (common/quantization/fp8_loading.py); this record carries the format they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FP8_BLOCK = (128, 128)  # the published checkpoints' weight_block_size
SCALE_SUFFIX = "_scale_inv"  # `x.weight` -> `x.weight_scale_inv`, fused experts `x.gate_up_proj_scale_inv`


class QuantConfigError(ValueError):
    """A quantization_config this engine cannot load; the message names the field."""


@dataclass(frozen=True)
class QuantConfig:
    """Block-FP8 weights: e4m3 values, one scale per (block_n x block_k) block; W = fp8 * weight_scale_inv."""

    method: str = "fp8"
    block: tuple[int, int] = FP8_BLOCK  # (rows, columns) of one scale block of an [out, in] weight
    activation_scheme: str = "dynamic"
    modules_to_not_convert: tuple[str, ...] = ()
    online: bool = False  # quantized at load from a 16 / 32-bit checkpoint (the `quantization fp8` option)

    @classmethod
    def from_hf(cls, raw: Any) -> "QuantConfig":
        if not isinstance(raw, dict):
            raise QuantConfigError(f"'quantization_config' must be an object, got {raw!r}")
        method = raw.get("quant_method")
        if method != "fp8":
            raise QuantConfigError(f"'quantization_config.quant_method' = {method!r} is not supported (only 'fp8', "
                                   "block-wise FP8 as Qwen's -FP8 checkpoints ship it)")  # fmt: skip
        fmt = raw.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise QuantConfigError(f"'quantization_config.fmt' = {fmt!r} is not supported (only 'e4m3')")
        scheme = raw.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise QuantConfigError(f"'quantization_config.activation_scheme' = {scheme!r} is not supported (only "
                                   "'dynamic': activations are scaled per token at run time)")  # fmt: skip
        block = raw.get("weight_block_size")
        if (not isinstance(block, list) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in block)):  # fmt: skip
            raise QuantConfigError(f"'quantization_config.weight_block_size' must be [rows, columns], got {block!r} "
                                   "(per-tensor FP8 is not supported)")  # fmt: skip
        if any(b < 16 or b & (b - 1) for b in block):
            raise QuantConfigError(f"'quantization_config.weight_block_size' {block}: each side must be a power of "
                                   "two >= 16")  # fmt: skip
        skip = raw.get("modules_to_not_convert") or []
        if not isinstance(skip, list) or not all(isinstance(m, str) for m in skip):
            raise QuantConfigError("'quantization_config.modules_to_not_convert' must be a list of module names")
        return cls(block=(block[0], block[1]), activation_scheme=scheme, modules_to_not_convert=tuple(skip))

    def to_hf(self) -> dict[str, Any]:
        """The config.json entry of a checkpoint in this format (tools/quantize_fp8.py)."""
        return {
            "quant_method": self.method,
            "fmt": "e4m3",
            "activation_scheme": self.activation_scheme,
            "weight_block_size": list(self.block),
            "modules_to_not_convert": list(self.modules_to_not_convert),
        }


def quant_config_of(hf: dict[str, Any]) -> QuantConfig | None:
    """The checkpoint's quantization_config: top level (the published wrappers), else inside text_config."""
    raw = hf.get("quantization_config")
    if raw is None and isinstance(hf.get("text_config"), dict):
        raw = hf["text_config"].get("quantization_config")
    return None if raw is None else QuantConfig.from_hf(raw)

"""RoPE scaling read from a config's `rope_parameters` (or the older `rope_scaling`), parsed once into RopeScaling.

The static types of HF's rope utils (transformers/modeling_rope_utils.py) that a KV cache can keep exactly are served:
`linear` (positions divided by `factor`), `yarn` (a per-frequency blend of interpolated and original frequencies plus
the attention factor on cos / sin) and `llama3` (long wavelengths divided by `factor`, a smooth band between). Types
whose frequencies depend on the current sequence length are refused at start-up, naming the type and why; so is any
other type. The frequencies themselves are computed in kernels/attention/rope_frequencies.py.

A `rope_scaling` engine option (EngineArgs) replaces the checkpoint's scaling keys: the checkpoint's rope_theta,
partial_rotary_factor and M-RoPE fields (mrope_section, mrope_interleaved) stay unless the override sets them too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# keys every rope_parameters dict may carry besides the scaling ones (M-RoPE's are text-irrelevant: T = H = W)
BASE_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")
SCALING_KEYS = {
    "default": (),
    "linear": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
}
REQUIRED_KEYS = {"linear": ("factor",), "yarn": ("factor",),
                 "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")}
REFUSED_TYPES = {
    "dynamic": "dynamic NTK recomputes the frequencies from each forward's longest sequence, so a cached token's "
               "rotation would change as the sequence grows (no KV cache keeps that exact); use 'yarn'",
    "longrope": "LongRoPE switches between its short and long factors by the current sequence length (HF recomputes "
                "them per forward), which a KV cache cannot keep exact; use 'yarn'",
    "proportional": "proportional RoPE rotates every head dim with zero-padded frequencies (Gemma), not Qwen3.5's "
                    "partial rotary dims",
}


class RopeScalingError(ValueError):
    """A rope scaling this engine cannot serve; the message names the type or key."""


@dataclass(frozen=True)
class RopeScaling:
    """A static RoPE scaling. original_max_position_embeddings: the pretraining window (linear: the model's
    max_position_embeddings); attention_factor: the factor cos and sin are multiplied by (YaRN's mscale, else 1)."""

    rope_type: str  # "linear", "yarn" or "llama3"
    factor: float
    original_max_position_embeddings: int
    attention_factor: float = 1.0
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: the correction range rounded out to whole dims
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3

    @property
    def max_positions(self) -> int:
        """The scaled window: factor x the original window."""
        return int(self.factor * self.original_max_position_embeddings)


def rope_type_of(rope: dict[str, Any]) -> str:
    """The type a rope_parameters dict names ('rope_type', or the older 'type'; 'default' when neither); refused and
    unknown types raise RopeScalingError."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in REFUSED_TYPES:
        raise RopeScalingError(f"rope_type {rope_type!r} is not supported: {REFUSED_TYPES[rope_type]}")
    if rope_type not in SCALING_KEYS:
        raise RopeScalingError(f"rope_type {rope_type!r} is not supported; supported: {sorted(SCALING_KEYS)}")
    return rope_type


def merge_override(checkpoint: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    """The rope_parameters in force: the checkpoint's, or with an override its scaling keys replaced by the
    override's (rope_theta, partial_rotary_factor and the M-RoPE fields kept unless the override sets them)."""
    if override is None:
        return dict(checkpoint)
    merged = {k: v for k, v in checkpoint.items() if k in BASE_KEYS and k not in ("rope_type", "type")}
    merged.update(override)
    return merged


def parse_rope_scaling(rope: dict[str, Any], max_position_embeddings: int,
                       original_override: int | None = None) -> RopeScaling | None:  # fmt: skip
    """RopeScaling of a rope_parameters dict, None for 'default'. original_override: a config-level
    `original_max_position_embeddings`, which HF prefers to the one inside the dict (Phi-3's layout)."""
    rope_type = rope_type_of(rope)
    allowed = set(BASE_KEYS) | set(SCALING_KEYS[rope_type])
    unknown = sorted(set(rope) - allowed)
    if unknown:
        raise RopeScalingError(f"rope_type {rope_type!r} does not take {unknown}; it takes {sorted(allowed)}")
    if rope_type == "default":
        return None
    missing = [k for k in REQUIRED_KEYS[rope_type] if rope.get(k) is None]
    if missing:
        raise RopeScalingError(f"rope_type {rope_type!r} needs {missing}")
    factor = _number(rope, "factor")
    if factor < 1.0:
        raise RopeScalingError(f"rope scaling 'factor' must be >= 1, got {factor}")
    if rope_type == "linear":
        return RopeScaling("linear", factor, max_position_embeddings)
    original = original_override or rope.get("original_max_position_embeddings") or max_position_embeddings
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise RopeScalingError(f"'original_max_position_embeddings' must be a positive int, got {original!r}")
    if rope_type == "llama3":
        low, high = _number(rope, "low_freq_factor"), _number(rope, "high_freq_factor")
        if high <= low:
            raise RopeScalingError(f"llama3 'high_freq_factor' ({high}) must exceed 'low_freq_factor' ({low})")
        return RopeScaling("llama3", factor, original, low_freq_factor=low, high_freq_factor=high)
    beta_fast = _number(rope, "beta_fast", optional=True) or 32.0  # HF: a 0 / None beta takes the default too
    beta_slow = _number(rope, "beta_slow", optional=True) or 1.0
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise RopeScalingError(f"yarn 'truncate' must be true or false, got {truncate!r}")
    return RopeScaling("yarn", factor, original, _yarn_attention_factor(rope, factor), beta_fast, beta_slow, truncate)


def _yarn_attention_factor(rope: dict[str, Any], factor: float) -> float:
    """YaRN's mscale as HF resolves it: an explicit attention_factor; else 0.1 ln(factor) + 1, or with both mscale
    and mscale_all_dim the ratio of those two scales (DeepSeek's form)."""
    explicit = _number(rope, "attention_factor", optional=True)
    if explicit is not None:
        if explicit <= 0:
            raise RopeScalingError(f"yarn 'attention_factor' must be > 0, got {explicit}")
        return explicit

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    mscale = _number(rope, "mscale", optional=True)
    mscale_all_dim = _number(rope, "mscale_all_dim", optional=True)
    if mscale and mscale_all_dim:
        return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
    return get_mscale(factor)


def _number(rope: dict[str, Any], key: str, optional: bool = False) -> float | None:
    value = rope.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise RopeScalingError(f"rope scaling {key!r} must be a number, got {value!r}")
    return float(value)

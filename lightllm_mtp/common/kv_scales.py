"""Per-tensor KV cache scales a checkpoint may ship for an FP8 KV cache (llm-compressor / vLLM naming:
`<layer>.self_attn.k_scale` and `<layer>.self_attn.v_scale`, scalars; K = stored * k_scale). Absent: 1.0."""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from lightllm_mtp.common.weight_loader import WeightLoadError, shard_index


def checkpoint_kv_scales(model_dir: str | Path, attention_prefixes: dict[int, str]) -> dict[int, tuple[float, float]]:
    """{kv layer: (k_scale, v_scale)} for the layers whose attention prefix (e.g. `...layers.3.self_attn.`) has both
    scalars in the checkpoint; one without the other, or a non-positive or non-scalar one, fails naming it."""
    model_dir = Path(model_dir)
    where = shard_index(model_dir)
    out: dict[int, tuple[float, float]] = {}
    for kv_layer, prefix in attention_prefixes.items():
        names = (f"{prefix}k_scale", f"{prefix}v_scale")
        present = [n for n in names if n in where]
        if not present:
            continue
        if len(present) == 1:
            raise WeightLoadError(f"{model_dir}: {present[0]} without its pair {({*names} - {present[0]}).pop()}")
        values = []
        for name in names:
            with safe_open(str(model_dir / where[name]), framework="pt") as f:
                t = f.get_tensor(name)
            if t.numel() != 1 or not float(t.float().reshape(())) > 0:
                raise WeightLoadError(f"{model_dir}: {name} must be one positive scalar, got shape {list(t.shape)} "
                                      f"{t.flatten()[:4].tolist()}")  # fmt: skip
            values.append(float(t.float().reshape(())))
        out[kv_layer] = (values[0], values[1])
    return out

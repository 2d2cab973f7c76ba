"""Writing checkpoints in the published Qwen3.5 layout, shared by make_tiny_checkpoint and train_tiny.

HF's `...ForConditionalGeneration.save_pretrained` writes config.json (text fields under text_config),
generation_config.json and `model.language_model.*` / `model.visual.*` / `lm_head.weight`; the `mtp.*` tensors are
added to the same `model-0000i-of-0000n.safetensors` shards. MoE experts: fused in the main model and per expert in
mtp.* as published for Qwen3.5, or either layout throughout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def mtp_stack(text_config, num_layers: int) -> torch.nn.Module:
    """HF's text model holding `num_layers` full-attention decoder layers, the MTP layers' structure (MoE MLP for
    the MoE model). Its `layers.{j}.*` are `mtp.layers.{j}.*`; its own 8-row embedding is never used."""
    import transformers

    text = text_config.to_dict()
    text.update(num_hidden_layers=num_layers, layer_types=["full_attention"] * num_layers, vocab_size=8)
    text.update(pad_token_id=None, bos_token_id=None, eos_token_id=None)
    mtp_cfg = type(text_config)(**{k: v for k, v in text.items() if k != "model_type"})
    return getattr(transformers, type(text_config).__name__.replace("TextConfig", "TextModel"))(mtp_cfg)


def split_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fused `experts.gate_up_proj` [E,2I,H] / `experts.down_proj` [E,H,I] -> per-expert `.weight` tensors."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e, (gate, up) in enumerate(zip(*t.chunk(2, dim=1))):
                out[f"{base}{e}.gate_proj.weight"], out[f"{base}{e}.up_proj.weight"] = gate.clone(), up.clone()
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            for e, down in enumerate(t):
                out[f"{base}{e}.down_proj.weight"] = down.clone()
        else:
            out[name] = t
    return out


def fuse_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` -> fused 3-D `experts.gate_up_proj` / `experts.down_proj`."""
    pat = re.compile(r"^(.*\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$")
    groups: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
    out = {}
    for name, t in tensors.items():
        m = pat.match(name)
        if m is None:
            out[name] = t
        else:
            groups.setdefault(m[1], {})[(m[3], int(m[2]))] = t
    for base, parts in groups.items():
        n = 1 + max(e for _, e in parts)
        out[f"{base}gate_up_proj"] = torch.stack([torch.cat([parts["gate", e], parts["up", e]]) for e in range(n)])
        out[f"{base}down_proj"] = torch.stack([parts["down", e] for e in range(n)])
    return out


def write_shards(out_dir: Path, tensors: dict[str, torch.Tensor], shard_bytes: int) -> None:
    """Replace HF's shards with `model-0000i-of-0000n.safetensors` of about `shard_bytes` each, plus the index."""
    for old in out_dir.glob("model*.safetensors*"):
        old.unlink()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def padded_vocab_size(tokenizer) -> int:
    return -(-len(tokenizer) // 64) * 64


def published_model_class(cfg) -> type:
    """Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration for a wrapper config."""
    import transformers

    return getattr(transformers, type(cfg).__name__.replace("Config", "ForConditionalGeneration"))


def write_published_checkpoint(
    model, out: Path, mtp: dict[str, torch.Tensor], fused_experts: bool | None,
    shard_bytes: int, dtype: torch.dtype | None = None,
) -> None:  # fmt: skip
    """Save an HF `...ForConditionalGeneration` (config.json, generation_config.json) with transformers, then
    re-shard its weights plus the `mtp.*` tensors into `model-0000i-of-0000n.safetensors` + index.

    `fused_experts` (MoE only): None writes the published Qwen3.5 layout (fused 3-D `experts.gate_up_proj` /
    `experts.down_proj` in the main model, per-expert `mtp.layers.0.mlp.experts.{e}.*`); True/False force fused or
    per-expert tensors for both the main model and mtp.*. `dtype` casts every tensor (config.json says so)."""
    import transformers

    if dtype is not None:
        model = model.to(dtype)
        mtp = {name: t.to(dtype) for name, t in mtp.items()}
    cfg = model.config
    ids = dict(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id)
    model.generation_config = transformers.GenerationConfig(**ids)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        model.save_pretrained(out, max_shard_size=f"{shard_bytes // 1024}KB")
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(out.glob("model*.safetensors")):  # HF writes one file without an index when it fits
        tensors.update(load_file(str(shard)))
    if fused_experts is None:  # as published for Qwen3.5 MoE: fused main-model experts, per-expert MTP experts
        tensors = fuse_experts(tensors) | split_experts(mtp)
    else:
        tensors.update(mtp)
        tensors = fuse_experts(tensors) if fused_experts else split_experts(tensors)
    write_shards(out, tensors, shard_bytes)

"""Draft checkpoints for the draft-model tests: a near copy of a target (its layers' weights perturbed, so most but
not all drafts are accepted) and the small random draft of make_tiny_checkpoint --draft --pard."""

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

NEAR_NOISE = 0.01  # relative to each tensor's std: on the tiny targets about half the drafts are accepted at k=3


def near_copy(src, dst, noise: float = NEAR_NOISE, seed: int = 0, pard_token: int | None = None) -> Path:
    """A copy of checkpoint `src` whose decoder-layer weights carry seeded Gaussian noise (noise x their std)."""
    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    for shard in sorted(dst.glob("*.safetensors")):
        tensors = load_file(shard)
        for name, value in tensors.items():
            if value.is_floating_point() and ".layers." in name:
                scale = noise * value.float().std().clamp_min(1e-3)
                tensors[name] = value + torch.randn(value.shape, generator=gen) * scale
        save_file(tensors, shard, metadata={"format": "pt"})
    if pard_token is not None:
        edit_config(dst, pard_token=pard_token)
    return dst


def edit_config(model_dir: Path, **text_fields) -> None:
    import json

    path = Path(model_dir) / "config.json"
    cfg = json.loads(path.read_text())
    cfg["text_config"].update(text_fields)
    path.write_text(json.dumps(cfg))

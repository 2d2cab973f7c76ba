"""The main job's default checkpoint: the trained tiny Qwen3.5 shipped under lightllm_mtp/fixtures/ when present,
else the random-weight tiny checkpoint, built on first use into the cache dir, then reused."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from lightllm_mtp.env import ENV

# Bump whenever make_tiny_checkpoint's recipe changes, so stale cached builds are not picked up.
RECIPE_VERSION = 1
_DONE_MARKER = ".complete"

# The runtime package ships one trained checkpoint, the main job's; the tests' trained checkpoints (MoE, 3 MTP
# modules, draft models) live under fixtures/ at the repository root (unit_tests/trained_fixtures.py).
FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures"
TRAINED_CHECKPOINTS = {"qwen3_5": "tiny_qwen3_5_trained"}


def complete_checkpoint(model_dir: Path) -> Path | None:
    """model_dir when it holds a complete checkpoint (config, tokenizer, index and every shard it names), else None."""
    index = model_dir / "model.safetensors.index.json"
    if not all(p.is_file() for p in (index, model_dir / "config.json", model_dir / "tokenizer.json")):
        return None
    shards = set(json.loads(index.read_text())["weight_map"].values())
    return model_dir if all((model_dir / shard).is_file() for shard in shards) else None


def trained_checkpoint_dir(arch: str = "qwen3_5") -> Path | None:
    """The shipped trained checkpoint `arch` (a key of TRAINED_CHECKPOINTS; lightllm_mtp/fixtures/README.md), or
    None while it is not there complete."""
    return complete_checkpoint(FIXTURES_DIR / TRAINED_CHECKPOINTS[arch])


def default_model_dir() -> Path:
    """The main job's checkpoint: the trained dense tiny model if shipped, else the cached random one."""
    return trained_checkpoint_dir("qwen3_5") or ensure_tiny_checkpoint()


def tiny_checkpoint_dir(arch: str = "qwen3_5", mtp_layers: int = 1, tie_word_embeddings: bool = False) -> Path:
    tied = "-tied" if tie_word_embeddings else ""
    return ENV.cache_dir / "tiny" / f"{arch}-mtp{mtp_layers}-seed0{tied}-v{RECIPE_VERSION}"


def ensure_tiny_checkpoint(arch: str = "qwen3_5", mtp_layers: int = 1, tie_word_embeddings: bool = False) -> Path:
    """Return the cached tiny checkpoint directory, building it first if needed.

    The build goes to a temporary sibling directory that is renamed into place, so concurrent callers either
    see a complete checkpoint or none; the loser of a race discards its copy.
    """
    target = tiny_checkpoint_dir(arch, mtp_layers, tie_word_embeddings)
    if (target / _DONE_MARKER).exists():
        return target
    from lightllm_mtp.tools.make_tiny_checkpoint import build_tiny_checkpoint

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)
    try:
        build_tiny_checkpoint(arch, tmp, mtp_layers=mtp_layers, seed=0, tie_word_embeddings=tie_word_embeddings)
        (tmp / _DONE_MARKER).write_text(f"recipe {RECIPE_VERSION}\n")
        if target.exists() and not (target / _DONE_MARKER).exists():
            shutil.rmtree(target, ignore_errors=True)  # leftover of an older, interrupted layout
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _DONE_MARKER).exists():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target

"""The built-in tiny checkpoint: built on first use into the cache dir, then reused."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from lightllm_mtp.env import ENV

# Bump whenever make_tiny_checkpoint's recipe changes, so stale cached builds are not picked up.
RECIPE_VERSION = 1
_DONE_MARKER = ".complete"


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

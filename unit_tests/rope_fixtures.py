"""Tiny checkpoints with RoPE scaling: a copy of a tiny checkpoint whose config declares a small native window
(ORIGINAL_WINDOW positions) and YaRN (or another type) over it, so that positions several times past the original
window are cheap to test on CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ORIGINAL_WINDOW = 64
YARN_FACTOR = 4
# rope_theta 1e4 with the tiny rotary dim 8: YaRN's ramp then blends one frequency partly (dims 0 kept, 1 half, 2-3
# interpolated), so the test covers the three regimes of the blend
YARN = {"rope_type": "yarn", "factor": YARN_FACTOR, "original_max_position_embeddings": ORIGINAL_WINDOW,
        "rope_theta": 1e4}  # fmt: skip


def with_rope(src: Path, dst: Path, rope: dict, max_position_embeddings: int = ORIGINAL_WINDOW) -> Path:
    """A copy of checkpoint `src` at `dst` whose text config's rope_parameters take the keys of `rope` (its M-RoPE
    fields and partial_rotary_factor kept) and whose max_position_embeddings is the given one."""
    shutil.copytree(src, dst)
    path = Path(dst) / "config.json"
    cfg = json.loads(path.read_text())
    text = cfg["text_config"]
    text["rope_parameters"] = {**text["rope_parameters"], **rope}
    text["max_position_embeddings"] = max_position_embeddings
    path.write_text(json.dumps(cfg, indent=2))
    return Path(dst)

"""A checkpoint's copy with its vocabulary padded to a larger size (e.g. Qwen3.5's 248320 ids), for host-side costs
that scale with the vocabulary (grammar masks, logits, copies) measured on a tiny model on CPU.

The embedding and lm_head get zero rows for the new ids: their logits are 0, below the trained model's best tokens,
and the tokenizer has no text for them, so a grammar never allows them (grammar_compiler.py empties their entries,
xgrammar's mark of a special token), as with the padded tokenizer of `grammar_cost --model_shape`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PADDED_TENSORS = ("lm_head.weight", "model.language_model.embed_tokens.weight")  # [vocab, hidden] each


def padded_vocab_checkpoint(model_dir: Path, vocab_size: int) -> Path:
    """A temporary directory with model_dir's checkpoint and tokenizer, its vocabulary padded to vocab_size."""
    root = Path(tempfile.mkdtemp(prefix="padded_vocab_"))
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copy(f, root / f.name)
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config", config)
    if vocab_size < text["vocab_size"]:
        raise ValueError(f"vocab_size {vocab_size} is below the checkpoint's {text['vocab_size']}")
    text["vocab_size"] = vocab_size
    (root / "config.json").write_text(json.dumps(config, indent=1))
    for shard in sorted(model_dir.glob("*.safetensors")):
        tensors = load_file(shard)
        for name in PADDED_TENSORS:
            if name in tensors:
                w = tensors[name]
                tensors[name] = torch.cat([w, w.new_zeros(vocab_size - w.shape[0], w.shape[1])])
        save_file(tensors, root / shard.name, metadata={"format": "pt"})
    return root

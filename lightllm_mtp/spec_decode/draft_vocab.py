"""A reduced draft vocabulary (the FR-Spec idea): the draft's logits cover only the most frequent token ids, so a
draft step reads a slice of the lm_head instead of all of it. Verification is unchanged: drafts are still greedy
(one-hot q on an id of the subset), which the accept rule handles exactly.

The file (tools/build_draft_vocab.py) is JSON: {"token_ids": [ids, most frequent first], "always": [ids kept
whatever the size, e.g. eos and special tokens], "vocab_size": V, "source": "..."}.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def load_draft_vocab(path: str | Path, size: int | None, vocab_size: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """[N] int64 token ids of the draft vocabulary: the first `size` ranked ids of the file (all of them for None),
    then the file's and the caller's always-kept ids not among them. Raises ValueError naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"mtp_draft_vocab_file {path}: no such file (build one with python -m "
                         "lightllm_mtp.tools.build_draft_vocab)")  # fmt: skip
    try:
        data = json.loads(path.read_text())
        ranked, kept = list(data["token_ids"]), list(data.get("always", []))
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"mtp_draft_vocab_file {path}: not a draft vocabulary file ({e})") from None
    if data.get("vocab_size", vocab_size) != vocab_size:
        raise ValueError(f"mtp_draft_vocab_file {path} was built for a vocabulary of {data['vocab_size']} ids; the "
                         f"model has {vocab_size}")  # fmt: skip
    for name, ids in (("token_ids", ranked), ("always", kept)):
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"mtp_draft_vocab_file {path}: {name} outside [0, {vocab_size}): {bad[:8]}")
    if len(set(ranked)) != len(ranked):
        raise ValueError(f"mtp_draft_vocab_file {path}: token_ids has duplicates")
    if size is not None and size > len(ranked):
        raise ValueError(f"mtp_draft_vocab_size {size} exceeds the {len(ranked)} ids of {path}")
    chosen = ranked if size is None else ranked[:size]
    seen = set(chosen)
    extra = [t for t in dict.fromkeys([*kept, *always]) if t not in seen]
    return torch.tensor(chosen + extra, dtype=torch.int64)

"""A checkpoint copied with new added tokens: the tokenizer's added_tokens get them with ids right after the
vocabulary, config.json's vocab_size grows by their number, and every vocabulary-sized tensor (embed_tokens, lm_head,
an MTP module's own embedding or head) gets one new row each, made by a `RowInit`; every other tensor is copied bit
for bit, and so is every other file (less the source model's measured figures). The tiny-fixture tools build on it
(make_tiny_vision.py: Qwen's vision tokens; make_tiny_chat.py: its chat tokens)."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lightllm_mtp.common.weight_loader import shard_index
from lightllm_mtp.tools.default_checkpoint import FIXTURES_DIR, TRAINED_CHECKPOINTS

DEFAULT_SOURCE = FIXTURES_DIR / TRAINED_CHECKPOINTS["qwen3_5"]  # the tools' default: the shipped trained checkpoint
INDEX = "model.safetensors.index.json"
_GROWN = ("config.json", INDEX, "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class NewToken:
    content: str
    special: bool  # a control token (skip_special_tokens drops it from decoded text); Qwen marks <think> etc. False


# (tensor name, its rows over the old vocabulary, generator) -> the new tokens' rows, in the tensor's dtype
RowInit = Callable[[str, torch.Tensor, torch.Generator], torch.Tensor]


def is_vocab_tensor(name: str) -> bool:
    return name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight")


def random_rows(count: int) -> RowInit:
    """Seeded random rows: embeddings at the trained rows' scale, head rows at a tenth of it (so the trained model
    rarely predicts the new tokens)."""

    def init(name: str, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        scale = t.float().std().item() * (0.1 if name.endswith("lm_head.weight") else 1.0)
        return (torch.randn(count, t.shape[1], generator=gen) * scale).to(t.dtype)

    return init


def text_config(hf: dict) -> dict:
    return hf.get("text_config", hf)


def write_config(out: Path, hf: dict) -> None:
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")


def _write_tokenizer(source: Path, out: Path, tokens: Sequence[NewToken], first_id: int) -> None:
    tok = json.loads((source / "tokenizer.json").read_text())
    present = {t["content"] for t in tok["added_tokens"]} | set(tok["model"]["vocab"])
    again = sorted(present & {t.content for t in tokens})
    if again:
        raise SystemExit(f"{source}: the tokenizer already has {again}")
    highest = max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])])
    if highest >= first_id:
        raise SystemExit(f"{source}: tokenizer id {highest} is not below the vocabulary size {first_id}")
    for i, t in enumerate(tokens):
        tok["added_tokens"].append({"id": first_id + i, "content": t.content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": t.special})  # fmt: skip
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    config = json.loads((source / "tokenizer_config.json").read_text())
    special = [t.content for t in tokens if t.special]
    if special:
        config["extra_special_tokens"] = list(config.get("extra_special_tokens") or []) + special
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_index(out: Path, weight_map: dict[str, str]) -> None:
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def grow_checkpoint(source: str | Path, out_dir: str | Path, tokens: Sequence[NewToken], rows: RowInit, seed: int,
                    keep: Callable[[str], bool] = lambda name: True, rewritten: Sequence[str] = ()
                    ) -> tuple[dict, dict[str, str]]:  # fmt: skip
    """Writes OUT_DIR (which must not exist yet, or be empty) from `source` with `tokens` added; the tensors `keep`
    rejects are left out, the files named in `rewritten` are not copied (the caller writes them). Returns (the new
    config.json, the weight map written to the index). Same source and seed, same files."""
    source, out = Path(source), Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out}: exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    hf = json.loads((source / "config.json").read_text())
    vocab = text_config(hf)["vocab_size"]
    for path in source.iterdir():
        measured = path.name.startswith(("acceptance", "train_log"))  # figures of the source model, not of this one
        skipped = path.name in _GROWN or path.name in rewritten or path.suffix == ".safetensors" or measured
        if path.is_file() and not skipped:
            shutil.copyfile(path, out / path.name)
    _write_tokenizer(source, out, tokens, vocab)
    text_config(hf)["vocab_size"] = vocab + len(tokens)
    write_config(out, hf)

    gen = torch.Generator().manual_seed(seed)
    where = shard_index(source)
    weight_map: dict[str, str] = {}
    for shard in sorted(set(where.values())):
        tensors = {n: t for n, t in load_file(str(source / shard)).items() if keep(n)}
        for name in sorted(tensors):
            t = tensors[name]
            if not is_vocab_tensor(name):
                continue
            if t.shape[0] != vocab:
                raise SystemExit(f"{name}: {t.shape[0]} rows, the vocabulary is {vocab}")
            tensors[name] = torch.cat([t, rows(name, t, gen)])
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
    write_index(out, weight_map)
    return hf, weight_map


def grow_main(make: Callable[[Path, Path, int], Path], description: str, argv: list[str] | None = None) -> None:
    """The tools' command line: OUT_DIR [--source DIR] [--seed N]; prints the checkpoint made."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="a trained tiny text checkpoint")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(make(args.out_dir, args.source, args.seed))

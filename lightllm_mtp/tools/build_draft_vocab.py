"""Build a reduced draft vocabulary: token ids ranked by frequency in a text corpus (spec_decode/draft_vocab.py).

    python -m lightllm_mtp.tools.build_draft_vocab --model_dir DIR --out vocab.json [--text_files a.txt b.txt]

The tokenizer comes from DIR; the corpus is the given text files, else the training split of the tiny corpus (the
interpreter's standard library, tools/tiny_corpus.py). Ids the corpus never produces are not ranked; the
tokenizer's special ids, its added tokens (special or not: Qwen's `<think>`, `</think>`, `<tool_call>` are added
tokens that are not special, and a corpus without chat text never ranks them, so drafts could never propose a
reasoning end or a tool call) and the checkpoint's eos ids go into "always" and are kept at every size.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path


def build(model_dir: str | Path, texts: list[str], source: str) -> dict:
    from transformers import AutoTokenizer

    from lightllm_mtp.config.model_config import ModelConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cfg = ModelConfig.from_model_dir(model_dir)
    counts: Counter[int] = Counter()
    for text in texts:
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if t < cfg.vocab_size]
    added = tokenizer.added_tokens_decoder
    always = sorted({*tokenizer.all_special_ids, *added, *cfg.eos_token_ids} & set(range(cfg.vocab_size)))
    total = sum(counts.values())
    return {
        "token_ids": ranked,
        "always": always,
        "vocab_size": cfg.vocab_size,
        "source": source,
        "corpus_tokens": total,
        # share of the corpus' tokens covered by the first N ids, for choosing N
        "coverage": {str(n): round(sum(counts[t] for t in ranked[:n]) / total, 4) for n in (256, 1024, 4096, 32768)
                     if n <= len(ranked)},  # fmt: skip
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", required=True, help="checkpoint whose tokenizer and config to use")
    p.add_argument("--out", required=True, help="JSON path")
    p.add_argument("--text_files", nargs="*", default=None, help="corpus (default: the tiny corpus' training split)")
    args = p.parse_args(argv)
    if args.text_files:
        missing = [f for f in args.text_files if not Path(f).is_file()]
        if missing:
            raise SystemExit(f"--text_files: no such file: {', '.join(missing)}")
        texts, source = [Path(f).read_text(errors="replace") for f in args.text_files], " ".join(args.text_files)
    else:
        from lightllm_mtp.tools.tiny_corpus import split_corpus

        texts, source = [f.text for f in split_corpus().train], "tiny_corpus training split (Python stdlib)"
    result = build(args.model_dir, texts, source)
    Path(args.out).write_text(json.dumps(result) + "\n")
    print(f"wrote {args.out}: {len(result['token_ids'])} ranked ids, coverage {result['coverage']}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()

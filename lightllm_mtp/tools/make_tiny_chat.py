"""A tiny chat Qwen3.5 checkpoint from a trained tiny text one: Qwen3.5's chat tokens as single added tokens, and the
shipped Qwen3.5 chat template.

    python -m lightllm_mtp.tools.make_tiny_chat OUT_DIR [--source DIR] [--seed 0]

From the source (default: the shipped lightllm_mtp/fixtures/tiny_qwen3_5_trained; the MoE or 3-MTP ones under
fixtures/ work the same) it writes OUT_DIR with
- the tokenizer plus CHAT_TOKENS, in the published tokenizer's order, ids right after the vocabulary (4096 .. 4101
  for the fixtures): `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`, `<think>`, `</think>`.
  Qwen's tokenizer_config marks them added tokens that are NOT special (unlike `<|im_end|>` or `<|vision_start|>`),
  so decoding with skip_special_tokens keeps them in the text, where the reasoning and tool-call parsers find them;
  so does this one. The source's `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` stay as they are;
- the vocabulary grown by those rows in every vocabulary-sized tensor (grow_vocab.py). A token with a twin in TWINS
  gets its twin's rows plus seeded noise (embedding: a tenth of the rows' spread, so the model reads it about as its
  twin; head: NOISE of it, so where the model would write the twin it writes either, by the sign of the noise's
  logit: the tiny model emits `</think>` of itself, as one token, inside MTP draft blocks too); the others get
  seeded random rows, their head rows small (rarely emitted);
- generation_config.json's eos ids as Qwen3.5's: `<|im_end|>` and `<|endoftext|>`;
- the shipped Qwen3.5 chat template (chat_templates/qwen3_5.jinja) as chat_template.jinja.
make_tiny_vision.py takes the result as its source (a chat + image checkpoint: the vision tokens after these).
transformers loads the result; nothing of it is committed (tests build it: unit_tests/chat_fixture.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from lightllm_mtp.tools.grow_vocab import DEFAULT_SOURCE, NewToken, RowInit, grow_checkpoint, grow_main, random_rows

CHAT_TEMPLATE = Path(__file__).resolve().parents[1] / "chat_templates" / "qwen3_5.jinja"
CHAT_TOKENS = tuple(NewToken(t, special=False) for t in (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"))  # fmt: skip
TWINS = {"</think>": "\n", "<tool_call>": "\n\n"}  # new token -> the text of the source token it doubles
NOISE = 0.3  # a twin's head-row noise, in units of the head rows' spread
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


def _source_ids(source: Path, texts) -> dict[str, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    ids = {}
    for text in texts:
        encoded = tok.encode(text, add_special_tokens=False).ids
        if len(encoded) != 1:
            raise SystemExit(f"{source}: {text!r} is {len(encoded)} tokens, not one")
        ids[text] = encoded[0]
    return ids


def twin_rows(twins: list[int | None]) -> RowInit:
    """The rows of the tokens in order: a twin's row plus noise, or (twin None) a random row as make_tiny_vision's."""
    randoms = random_rows(1)

    def init(name: str, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        spread = t.float().std().item()
        noise = NOISE if name.endswith("lm_head.weight") else 0.1
        rows = []
        for twin in twins:
            if twin is None:
                rows.append(randoms(name, t, gen))
            else:
                row = t[twin].float() + torch.randn(t.shape[1], generator=gen) * noise * spread
                rows.append(row[None].to(t.dtype))
        return torch.cat(rows)

    return init


def make_tiny_chat(out_dir: str | Path, source: str | Path = DEFAULT_SOURCE, seed: int = 0) -> Path:
    """Writes OUT_DIR (which must not exist yet, or be empty); returns it. Same source and seed, same files."""
    source, out = Path(source), Path(out_dir)
    twin_ids = _source_ids(source, TWINS.values())
    twins = [twin_ids[TWINS[t.content]] if t.content in TWINS else None for t in CHAT_TOKENS]
    grow_checkpoint(source, out, CHAT_TOKENS, twin_rows(twins), seed,
                    rewritten=("chat_template.jinja", "generation_config.json"))  # fmt: skip
    eos = _source_ids(source, EOS_TOKENS)
    generation = json.loads((source / "generation_config.json").read_text())
    generation["eos_token_id"] = [eos[t] for t in EOS_TOKENS]
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    shutil.copyfile(CHAT_TEMPLATE, out / "chat_template.jinja")
    return out


def main(argv: list[str] | None = None) -> None:
    grow_main(make_tiny_chat, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    main()

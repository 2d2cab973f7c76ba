"""HF transformers reference outputs for parity tests (fp32, CPU, eval mode, no grad).

`Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM.from_pretrained` read our multimodal-layout checkpoints directly:
the text config comes from `text_config`, HF's conversion mapping strips `language_model.` from the weight
names (and fuses per-expert MoE weights), and `model.visual.*` / `mtp.*` are ignored on load.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=None)
def _load(model_dir: str):
    import transformers

    model_type = json.loads((Path(model_dir) / "config.json").read_text())["model_type"]
    cls = {"qwen3_5": transformers.Qwen3_5ForCausalLM, "qwen3_5_moe": transformers.Qwen3_5MoeForCausalLM}[model_type]
    model, info = cls.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    if info["missing_keys"] or info["mismatched_keys"]:
        raise RuntimeError(f"HF could not load every weight of {model_dir}: {info}")
    # generate() fills unset fields from model.generation_config, so eos must be cleared here (see hf_greedy).
    model.generation_config.eos_token_id = None
    return model.eval()


def load_hf_causal_lm(model_dir):
    """The HF text-only causal LM for a checkpoint directory, cached per resolved path."""
    return _load(str(Path(model_dir).resolve()))


@torch.no_grad()
def hf_prefill_logits(model_dir, token_ids: list[int]) -> torch.Tensor:
    """Logits at every prompt position, shape [len(token_ids), vocab]; one forward, no cache."""
    model = load_hf_causal_lm(model_dir)
    ids = torch.tensor([token_ids], dtype=torch.long)
    return model(input_ids=ids, use_cache=False).logits[0].float()


@torch.no_grad()
def hf_greedy(model_dir, token_ids: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decode with HF's cache; returns (new tokens, raw logits of each step [max_new_tokens, vocab]).

    step_logits[0] are the last prompt position's logits. Neither the call's generation config nor the cached
    model's has an eos id (passing eos_token_id=None alone is not enough: generate() would fill it from
    model.generation_config), and there is no min-length processor, so HF neither stops early nor masks eos:
    the pure argmax chain, like ignore_eos.
    """
    import transformers

    model = load_hf_causal_lm(model_dir)
    gen = transformers.GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    ids = torch.tensor([token_ids], dtype=torch.long)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    new_tokens = out.sequences[0, len(token_ids) :].tolist()
    step_logits = torch.cat(out.logits, dim=0).float()
    if len(new_tokens) != max_new_tokens or step_logits.shape[0] != max_new_tokens:
        raise RuntimeError(f"HF generate stopped early: {len(new_tokens)} of {max_new_tokens} tokens")
    return new_tokens, step_logits


@torch.no_grad()
def hf_greedy_chunked(
    model_dir, token_ids: list[int], max_new_tokens: int, chunk_sizes: list[int]
) -> tuple[list[int], torch.Tensor]:
    """Like hf_greedy, but HF reads the prompt in the given chunks through its cache (its chunked GDN path with
    an initial state), then decodes greedily one token at a time: the like-for-like oracle of chunked prefill.
    fp32 rounding depends on the chunking (HF's own chunked and whole-prompt logits differ by ~1e-4 at
    sensitive steps), so chunked prefill is compared with HF chunked the same way."""
    if sum(chunk_sizes) != len(token_ids):
        raise ValueError(f"chunks {chunk_sizes} do not cover a prompt of {len(token_ids)} tokens")
    model = load_hf_causal_lm(model_dir)
    ids = torch.tensor([token_ids], dtype=torch.long)
    cache, start = None, 0
    for n in chunk_sizes:
        out = model(input_ids=ids[:, start : start + n], past_key_values=cache, use_cache=True)
        cache, start = out.past_key_values, start + n
    logits, tokens = [out.logits[0, -1].float()], []
    for _ in range(max_new_tokens - 1):
        tokens.append(int(logits[-1].argmax()))
        out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits.append(out.logits[0, -1].float())
    tokens.append(int(logits[-1].argmax()))
    return tokens, torch.stack(logits)

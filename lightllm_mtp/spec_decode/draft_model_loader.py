"""An external draft model (`mtp_mode=draft_model`): a smaller Qwen3.5 checkpoint (dense or MoE, hybrid GDN) loaded
beside the target, with the start-up checks that make its drafts meaningful.

The draft is a full TpPartBaseModel with its own caches: its own KV pool (its full-attention layers, indexed by the
target's KV slots: the target's allocator hands out slots for both), its own GDN state slots (one per request
slot), and the target's page table (`req_to_token`, shared by reference). Its GDN state has the speculative layout
of a target with 2k - 1 drafts (conv slot K-2+2k columns, 2k SSM rows per request): a draft window of up to 2k
rows (PARD) keeps a state per row, and the autoregressive chain steps append theirs after the committed one
(spec_decode/draft_model_proposer.py), so that rollback after verify is an index, never a copy.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lightllm_mtp.common.basemodel.basemodel import TpPartBaseModel
from lightllm_mtp.common.layers.embedding import LMHead
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.config.spec_config import SpecConfig
from lightllm_mtp.models.registry import create_model

_MASK_TOKEN_KEYS = ("pard_token", "mask_token_id")


def draft_state_tokens(num_draft_tokens: int) -> int:
    """The draft's GDN state is laid out like a target's with this many drafts (2k rows per request)."""
    return 2 * num_draft_tokens - 1


def load_draft_model(main: TpPartBaseModel, main_model_dir: str, spec: SpecConfig, token_map=None,
                     rope_scaling: dict | None = None) -> TpPartBaseModel:  # fmt: skip
    """The draft checkpoint of `spec` beside `main` (same dtype, device, request slots, KV slot count), with the
    engine's RoPE override (`rope_scaling`, as the target takes it). Raises ValueError naming the problem: no such
    directory, another vocabulary, too short a context."""
    path = Path(spec.draft_model_dir)
    if not path.is_dir():
        raise ValueError(f"mtp_draft_model_dir {path}: no such directory (the draft model's checkpoint)")
    cfg = ModelConfig.from_model_dir(path, rope_scaling=rope_scaling)
    if cfg.vocab_size != main.cfg.vocab_size:
        raise ValueError(
            f"draft model {path} has vocab_size {cfg.vocab_size}, the target {main_model_dir} has "
            f"{main.cfg.vocab_size}: a draft model must share the target's vocabulary"
        )
    mismatch = tokenizer_mismatch(Path(main_model_dir), path)
    if mismatch:
        raise ValueError(f"draft model {path} and target {main_model_dir} have different tokenizers: {mismatch}")
    if cfg.max_context_len < main.rt.max_model_len:
        window = (f"max_position_embeddings {cfg.max_position_embeddings}" if cfg.rope_scaling is None else
                  f"a RoPE-scaled window of {cfg.max_context_len}")  # fmt: skip
        raise ValueError(
            f"draft model {path} has {window} < max_model_len {main.rt.max_model_len}: the draft must cover the "
            "target's context (lower max_model_len, or pass a rope_scaling that covers it: it applies to the draft too)"
        )
    rt = dataclasses.replace(main.rt, num_draft_tokens=draft_state_tokens(spec.num_draft_tokens), draft_kv_layers=0,
                             kv_dtype=main.rt.draft_kv_pool_dtype)  # the draft's KV: draft_kv_cache_dtype
    draft = create_model(path, cfg, rt)
    draft.caches.req_manager.req_to_token = main.caches.req_manager.req_to_token  # one page table, one slot space
    if token_map is not None:
        draft.lm_head = LMHead(draft.lm_head.weight[token_map].contiguous())
    return draft


def pard_mask_token(spec: SpecConfig, draft: TpPartBaseModel) -> int:
    """PARD's mask token id: the flag, else the draft config's `pard_token` / `mask_token_id`."""
    token = spec.mask_token_id
    if token is None:
        with open(Path(spec.draft_model_dir) / "config.json") as f:
            hf = json.load(f)
        sources = [hf, hf.get("text_config") or {}]
        found = [src[key] for src in sources for key in _MASK_TOKEN_KEYS if src.get(key) is not None]
        if not found:
            raise ValueError(
                f"parallel drafting with draft model {spec.draft_model_dir} needs a mask token id: its config.json "
                f"declares none ({' / '.join(_MASK_TOKEN_KEYS)}); pass mtp_mask_token_id (--mtp_mask_token_id)"
            )
        token = found[0]
    if not isinstance(token, int) or not 0 <= token < draft.cfg.vocab_size:
        raise ValueError(f"PARD mask token id {token!r} is outside the vocabulary [0, {draft.cfg.vocab_size})")
    return token


def tokenizer_mismatch(main_dir: Path, draft_dir: Path) -> str | None:
    """The first difference between the two directories' tokenizer.json vocabularies (None when equal, or when
    either has none: then only vocab_size is compared)."""
    vocabs = []
    for d in (main_dir, draft_dir):
        path = d / "tokenizer.json"
        if not path.is_file():
            return None
        with open(path) as f:
            tok = json.load(f)
        vocab = dict((tok.get("model") or {}).get("vocab") or {})
        vocab.update({t["content"]: t["id"] for t in tok.get("added_tokens") or []})
        vocabs.append(vocab)
    main, draft = vocabs
    if main == draft:
        return None
    for text, token in main.items():
        if draft.get(text) != token:
            return f"{text!r} is id {token} in the target, {draft.get(text)} in the draft"
    extra = next(text for text in draft if text not in main)
    return f"{extra!r} (id {draft[extra]}) is in the draft's vocabulary only"

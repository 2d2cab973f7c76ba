"""One memory budget for the full-attention KV pool and the prefix cache's GDN state snapshots.

The budget is the bytes of `max_total_token_num` KV token slots (default: what fits `mem_fraction` of the GPU when
that is given (engine/memory_budget.py), else max_batch_size * (max_model_len + the KV lookahead slots of one
request), so that a default engine admits every request max_model_len allows). With the
prefix cache on, the KV pool gets (1 - prefix_cache_state_share) of it (default: auto_state_share), never less than
one max_model_len request where the budget holds one, and snapshots the rest, at least MIN_SNAPSHOTS:
a few cached prefixes stay resumable where one snapshot outweighs many KV slots (small models, small budgets); only
that floor's excess comes on top of the budget. Eviction (common/radix_cache.py) runs across both: KV pressure drops
least recently used leaves with their snapshots, snapshot pressure the least recently used snapshot and the leaves
nothing can resume in any more.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import LayerType, ModelConfig
from lightllm_mtp.config.spec_config import MtpMode
from lightllm_mtp.engine.memory_budget import budget_tokens_from_memory
from lightllm_mtp.engine.step import kv_lookahead_slots

MIN_SNAPSHOTS = 4
# prefix_cache_state_share None: room for this many snapshots per request slot (a running prompt's boundaries and
# the end snapshots that finished requests leave for their next turn), within AUTO_SHARE_RANGE of the budget
AUTO_SNAPSHOTS_PER_REQUEST = 4
AUTO_SHARE_RANGE = (0.1, 0.5)


@dataclass(frozen=True)
class CacheBudget:
    kv_tokens: int  # KV pool token slots
    num_snapshots: int  # GDN state snapshot slots (0: no prefix cache)
    kv_bytes_per_token: int
    snapshot_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token + self.num_snapshots * self.snapshot_bytes


def kv_bytes_per_token(cfg: ModelConfig, dtype_bytes: int, draft_kv_layers: int,
                       draft_dtype_bytes: int | None = None) -> int:  # fmt: skip
    """K and V of one token in every full-attention layer and every MTP draft module's layer (one process);
    dtype_bytes: the KV cache's element (1 for kv_cache_dtype fp8), draft_dtype_bytes the draft layers' (default the
    same)."""
    layers = sum(1 for t in cfg.layer_types if t is LayerType.FULL_ATTENTION)
    draft_bytes = dtype_bytes if draft_dtype_bytes is None else draft_dtype_bytes
    return (layers * dtype_bytes + draft_kv_layers * draft_bytes) * 2 * cfg.num_key_value_heads * cfg.head_dim


def snapshot_bytes(cfg: ModelConfig, dtype_bytes: int) -> int:
    """One snapshot: per GDN layer the K-1 conv columns (model dtype) and one fp32 SSM state (StateSnapshotPool)."""
    layers = sum(1 for t in cfg.layer_types if t is LayerType.LINEAR_ATTENTION)
    key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    conv_dim = 2 * key_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    conv = conv_dim * (cfg.linear_conv_kernel_dim - 1) * dtype_bytes
    ssm = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    return layers * (conv + ssm)


def split_budget(budget_tokens: int, kv_per_token: int, snap_bytes: int, share: float | None,
                 min_kv_tokens: int = 1) -> CacheBudget:  # fmt: skip
    """share None (no prefix cache): the whole budget is KV. Otherwise the KV pool gets (1 - share) of the budget's
    bytes, but at least min_kv_tokens (one max-length request) where the budget has them, and the snapshots the
    rest, at least MIN_SNAPSHOTS (the floor's excess comes on top of the budget)."""
    if share is None or snap_bytes == 0:
        return CacheBudget(budget_tokens, 0, kv_per_token, snap_bytes)
    total = budget_tokens * kv_per_token
    kv_tokens = max(1, int(budget_tokens * (1 - share)), min(min_kv_tokens, budget_tokens))
    num = max(MIN_SNAPSHOTS, (total - kv_tokens * kv_per_token) // snap_bytes)
    return CacheBudget(kv_tokens, num, kv_per_token, snap_bytes)


def auto_state_share(budget_bytes: int, snap_bytes: int, max_batch_size: int) -> float:
    """The default snapshot share: AUTO_SNAPSHOTS_PER_REQUEST snapshots per request slot, clamped to
    AUTO_SHARE_RANGE (a share of 0.1 gave a 27B-shape server 5 snapshots for 16 request slots: no multi-turn hits)."""
    lo, hi = AUTO_SHARE_RANGE
    want = AUTO_SNAPSHOTS_PER_REQUEST * max_batch_size * snap_bytes / max(1, budget_bytes)
    return min(max(want, lo), hi)


def cache_budget_of(args: EngineArgs, cfg: ModelConfig, max_model_len: int) -> CacheBudget:
    """The engine's split of its KV budget: model-wide figures, so every tp / pp rank gets the same slot counts.
    With a draft model (mtp_mode draft_model) a KV slot also holds the draft's KV (its pool is indexed by the
    target's slots) and a snapshot also the draft's GDN state (engine/prefix_cache.py): both count."""
    dtype_bytes = torch.empty(0, dtype=args.dtype).element_size()
    kv_bytes = torch.empty(0, dtype=args.kv_dtype).element_size()
    draft_kv_bytes = torch.empty(0, dtype=args.draft_kv_dtype).element_size()
    spec = args.spec
    kv = kv_bytes_per_token(cfg, kv_bytes, spec.num_draft_modules if spec else 0, draft_kv_bytes)
    snap = snapshot_bytes(cfg, dtype_bytes)
    if spec is not None and spec.mode is MtpMode.DRAFT_MODEL and Path(spec.draft_model_dir).is_dir():
        # (a missing directory is refused by the draft loader, spec_decode/draft_model_loader.py)
        draft = ModelConfig.from_model_dir(spec.draft_model_dir)
        kv += kv_bytes_per_token(draft, draft_kv_bytes, 0)
        snap += snapshot_bytes(draft, dtype_bytes)
    # the KV pool keeps one request of max_model_len tokens and its lookahead slots (Scheduler.kv_need) admissible;
    # the default budget holds max_batch_size of them
    lookahead = kv_lookahead_slots(spec.num_draft_tokens if spec is not None else 0)
    if args.mem_fraction is not None and args.max_total_token_num is None:
        budget = budget_tokens_from_memory(args, cfg, kv, snap, max_model_len + lookahead)
    else:
        budget = args.resolved_kv_pool_size(max_model_len, lookahead)
    share = None
    if args.prefix_cache:
        share = args.prefix_cache_state_share
        if share is None:
            share = auto_state_share(budget * kv, snap, args.max_batch_size)
    return split_budget(budget, kv, snap, share, min_kv_tokens=max_model_len + lookahead)

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.spec_decode.adaptive import AcceptanceEstimate
from lightllm_mtp.spec_decode.stats import SpecStats


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(Enum):
    STOP = "stop"  # eos or a stop token
    LENGTH = "length"  # max_new_tokens or max_model_len
    ABORT = "abort"


@dataclass
class Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    req_idx: int | None = None  # request slot while running
    kv_slots: list[torch.Tensor] = field(default_factory=list)  # host int32 KV slots, in position order
    num_computed: int = 0  # tokens whose KV / linear state is stored
    reserved_tokens: int = 0  # KV slots the scheduler set aside for this request
    # MTP: host KV slots of the open verify blocks, oldest first (the next one to verify, then any queued ahead)
    blocks: list[torch.Tensor] = field(default_factory=list)
    spec_stats: SpecStats = SpecStats()
    acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)  # adaptive speculation's estimate
    # prefix cache (engine/prefix_cache.py): kv_slots[..][:cached_len] are the tree's, locked through cache_node
    cached_len: int = 0
    num_cached_tokens: int = 0  # prompt tokens it resumed past (cached_len at admission)
    cache_node: Any = None  # common/radix_cache.Node
    resume_snapshot: Any = None  # common/radix_cache.Snapshot to restore on its first step
    # draft model, resume_snapshot without the draft's half: (the draft's Snapshot or None, its depth)
    draft_resume: Any = None
    pending_snapshots: list = field(default_factory=list)  # (position, Snapshot) that enter the tree at its end
    # ended while a verify of it was queued (overlap): called with that verify's emitted tokens (None: never read)
    on_verified: Any = None
    last_accept: int = 0  # MTP: rows its last collected verify committed (the prefix cache's end snapshot)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    def token_at(self, pos: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[pos] if pos < n else self.output_ids[pos - n]

    def pending_tokens(self) -> list[int]:
        """Tokens whose KV is not stored yet (a prompt remainder, or the last sampled token)."""
        return [self.token_at(p) for p in range(self.num_computed, self.num_tokens)]

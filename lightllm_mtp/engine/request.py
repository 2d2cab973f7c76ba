from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from lightllm_mtp.sampling_params import SamplingParams


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(Enum):
    STOP = "stop"  # eos or a stop token
    LENGTH = "length"  # max_new_tokens or max_model_len
    ABORT = "abort"


@dataclass
class DraftBlock:
    """The next verify block of a request: [token at `start`, *tokens] at positions start..start+len(tokens).
    Its KV slots are allocated and written into req_to_token when the drafts are made."""

    start: int  # -1 while the block made on the device (overlap) waits for the accept lengths before it
    slots: torch.Tensor  # [1 + number of drafts] int32 host
    tokens: list[int] = field(default_factory=list)  # empty until the host has them (blocks made on the device)

    @property
    def num_drafts(self) -> int:
        return self.slots.numel() - 1


@dataclass
class SpecStats:
    """MTP acceptance of one request."""

    num_steps: int = 0  # verify steps
    num_drafts: int = 0  # drafted tokens verified
    num_accepted: int = 0  # drafted tokens accepted
    proposed_at: list[int] = field(default_factory=list)  # [k] drafts verified at draft position j
    accepted_at: list[int] = field(default_factory=list)  # [k] drafts accepted at draft position j

    def record(self, num_drafts: int, num_accepted: int, max_steps: int) -> None:
        if not self.proposed_at:
            self.proposed_at = [0] * max_steps
            self.accepted_at = [0] * max_steps
        self.num_steps += 1
        self.num_drafts += num_drafts
        self.num_accepted += num_accepted
        for j in range(num_drafts):
            self.proposed_at[j] += 1
            self.accepted_at[j] += int(j < num_accepted)

    @property
    def mean_accepted_tokens_per_step(self) -> float:
        """Tokens emitted per verify step (accepted drafts + 1)."""
        return (self.num_accepted + self.num_steps) / self.num_steps if self.num_steps else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]


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
    draft: DraftBlock | None = None  # MTP: the verify block of the next step
    spec_stats: SpecStats = field(default_factory=SpecStats)

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

"""A step queued on the device, the runners that queue it, and its results on their way to the host.

Overlap scheduling (the engine launches step N+1 before it reads step N's tokens) keeps the device busy while the
host does step N's bookkeeping: a LaunchedStep is what the engine holds between a runner's `launch*` and `collect`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Union

import torch

from lightllm_mtp.common.basemodel.forward_batch import ForwardBatch
from lightllm_mtp.engine.request import EndState, Request
from lightllm_mtp.engine.scheduler import ScheduledRequest


class HostCopy:
    """A device tensor copied to pinned host memory without blocking; `tolist()` waits for that copy only."""

    def __init__(self, values: torch.Tensor):
        self.event: torch.cuda.Event | None = None
        if values.is_cuda:
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = values

    def tolist(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


@dataclass
class DecodeStep:
    """A plain step: reqs get one sampled token each (tokens [B] on the device: the next decode step's input ids).
    tokens is None when no request samples (prompt chunks that do not finish their prompt)."""

    reqs: list[Request]
    tokens: torch.Tensor | None = None
    host_tokens: HostCopy | None = None
    host_logprobs: HostCopy | None = None  # sampling/logprobs.py rows, when a request asks for logprobs


@dataclass
class PromptChunksLaunch:
    """Prompt chunks of a speculative step: `sampled` finish their prompt and get a first token (host copy)."""

    sampled: list[Request]
    host_tokens: HostCopy | None
    host_logprobs: HostCopy | None = None
    host_candidates: HostCopy | None = None  # grammar requests' draft candidates (sampling/draft_choice.py)


@dataclass
class VerifyLaunch:
    """Verify blocks of a speculative step: per request the host KV slots of the block it verifies; the host copy
    holds per request [accept length, emitted tokens (k+1, -1 padded), drafts that counted, the next block's drafts
    (k)]."""

    reqs: list[Request]
    blocks: list[torch.Tensor]
    batch: ForwardBatch
    host: HostCopy
    host_logprobs: HostCopy | None = None  # [B, q, 1 + 2 top] (sampling/logprobs.py) per verify row
    host_candidates: HostCopy | None = None  # grammar requests' next-draft candidates (sampling/draft_choice.py)


@dataclass
class SpecStep:
    reqs: list[Request]  # prompt-chunk requests that sample, then verify requests
    prompt: PromptChunksLaunch | None = None
    verify: VerifyLaunch | None = None


LaunchedStep = Union[DecodeStep, SpecStep]


def kv_lookahead_slots(num_draft_tokens: int) -> int:
    """KV slots a request may hold beyond its tokens (Scheduler.kv_need): plain decoding (0 drafts) 1, a decode row
    queued for a request that finishes in the step before; MTP 3 blocks of k+1 rows, the one a step verifies, the
    one it opens and one more queued ahead (overlap)."""
    return 1 if num_draft_tokens == 0 else 3 * (num_draft_tokens + 1)


class StepRunner(Protocol):
    """What the engine drives: ModelRunner (plain decoding) and SpecRunner (speculative decoding)."""

    max_tokens_per_step: int  # tokens one request can get from one step
    lookahead_slots: int  # KV slots a request may hold beyond its tokens (blocks queued ahead, wasted rows)

    def launch(self, scheduled: list[ScheduledRequest], after: LaunchedStep | None = None) -> LaunchedStep:
        """Queues a step on the device without waiting for it. after: the step queued just before, whose results
        the host has not read yet (its requests' newest tokens are still on the device)."""

    def collect(self, step: LaunchedStep) -> list[tuple[Request, list[int]]]: ...

    def release(self, req: Request) -> None:
        """Returns the request's KV slots, open blocks and request slot (engine/request_end.py calls it)."""

    def end_state(self, req: Request) -> EndState:
        """Where a request's committed GDN state sits in its slot, and (MTP) the KV slot of its newest token's row in
        a queued verify, taken out of what release frees: what the prefix cache reads at its end."""

    def settle(self, step: LaunchedStep) -> None:
        """Delivers what a step the engine drops unread owes to requests awaiting it (AWAITING_VERIFY)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum

import torch

from lightllm_mtp.common.radix_cache import Node, Snapshot
from lightllm_mtp.multimodal.prompt_images import PromptImages
from lightllm_mtp.sampling.grammar import RequestGrammar
from lightllm_mtp.sampling.logprobs import TokenLogprob
from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.spec_decode.adaptive import AcceptanceEstimate
from lightllm_mtp.spec_decode.stats import SpecStats


class RequestStatus(Enum):
    """A request's life (engine/request_end.py releases what it holds):
    WAITING -> RUNNING (admitted: slots are taken as it is scheduled) -> FINISHED (everything it held given back);
    RUNNING -> AWAITING_VERIFY -> FINISHED: it ended while a verify of it was queued (overlap) and the prefix cache
    waits for that verify's first emitted token to key its last position (its end node, KV slot and snapshot are
    held until then); WAITING -> FINISHED: aborted before admission (it holds nothing)."""

    WAITING = "waiting"
    RUNNING = "running"
    AWAITING_VERIFY = "awaiting_verify"
    FINISHED = "finished"


_TRANSITIONS = {
    RequestStatus.WAITING: (RequestStatus.RUNNING, RequestStatus.FINISHED),
    RequestStatus.RUNNING: (RequestStatus.AWAITING_VERIFY, RequestStatus.FINISHED),
    RequestStatus.AWAITING_VERIFY: (RequestStatus.FINISHED,),
    RequestStatus.FINISHED: (),
}


class FinishReason(Enum):
    STOP = "stop"  # eos or a stop token
    LENGTH = "length"  # max_new_tokens or max_model_len
    ABORT = "abort"
    ERROR = "error"  # the request could not be served (Request.error says why): its grammar did not compile


@dataclass(frozen=True)
class DraftResume:
    """Draft model: where the draft resumes when its request's snapshot lacks the draft's half (partial): the deepest
    complete snapshot above it (pinned until the restore; None: the draft starts from nothing) and its depth."""

    snapshot: Snapshot | None
    depth: int


@dataclass(frozen=True)
class QueuedVerifyEnd:
    """The end of a request in AWAITING_VERIFY: the KV slot of its newest token's row in the queued verify and the
    snapshot of the state after that row; they join the tree below its end node once the verify's first emitted token
    (the position's key lookahead) reaches the host."""

    held: torch.Tensor
    snapshot: Snapshot


@dataclass(frozen=True)
class EndState:
    """What the runner knows of a request's GDN state slot as it ends (StepRunner.end_state, taken before release):
    plain data the cache reads, never a call back into the runner."""

    committed: torch.Tensor | int | None  # the committed state's conv column / SSM row (None: a verify of it is queued)
    committed_row: int  # the host's index of that row in the last collected verify (earlier rows are kept down to 0)
    held: torch.Tensor | None = None  # KV slot of its newest token's row in a queued verify, kept out of release

    def state_at(self, back: int) -> torch.Tensor | int | None:
        """The slot offset of the state `back` positions before the committed one; None: not kept."""
        if self.committed is None or back == 0:
            return self.committed
        row = self.committed_row - back
        return row if row >= 0 else None


@dataclass
class CacheHold:
    """What a request holds in the prefix cache (engine/prefix_cache.py)."""

    # the tree node it locks: while it runs, the end of its shared prefix (kv_slots[..][:cached_len] are the tree's);
    # in AWAITING_VERIFY, its end node, below which queued_end joins the tree
    node: Node | None = None
    resume: Snapshot | None = None  # to restore into its GDN state on its first step (pinned until then)
    draft_resume: DraftResume | None = None  # draft model, resume without the draft's half
    pending: list[tuple[int, Snapshot]] = field(default_factory=list)  # (position, snapshot) entering the tree at end
    queued_end: QueuedVerifyEnd | None = None

    @property
    def cached_len(self) -> int:
        """Positions of its KV that are the tree's (shared, locked)."""
        return self.node.depth if self.node is not None else 0


@dataclass
class Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    req_idx: int | None = None  # request slot while running (it owns the GDN state slot and the DraftState row)
    kv_slots: list[torch.Tensor] = field(default_factory=list)  # host int32 KV slots, in position order
    num_computed: int = 0  # tokens whose KV / linear state is stored
    # MTP: host KV slots of the open verify blocks, oldest first (the next one to verify, then any queued ahead)
    blocks: list[torch.Tensor] = field(default_factory=list)
    spec_stats: SpecStats = SpecStats()
    acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)  # adaptive speculation's estimate
    last_accept: int = 0  # MTP: rows its last collected verify committed (the prefix cache's end snapshot)
    num_cached_tokens: int = 0  # prompt tokens it resumed past (the prefix cache's cached_len at admission)
    cache_hold: CacheHold = field(default_factory=CacheHold)
    # params.logprobs: one per output token; the runner's collect leaves a step's in pending_logprobs, the engine
    # moves those of the tokens it keeps into output_logprobs
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] | None = None
    grammar: RequestGrammar | None = None  # params.structured: its matcher over the committed output
    compiling: Future | None = None  # its grammar, compiling in the background: it is not admitted until done
    error: str | None = None  # FinishReason.ERROR: what went wrong
    next_drafts: list[int] = field(default_factory=list)  # MTP: the drafts of its newest open block, as last collected
    # MTP with a grammar: per draft position of its newest block, the proposer's best ids (engine/grammar_rows.py)
    draft_candidates: list[list[int]] | None = None
    images: PromptImages | None = None  # the prompt's images (multimodal/prompt_images.py)

    @property
    def key_prompt_ids(self) -> list[int]:
        """The prompt as the prefix cache keys it: image tokens stand for their image's content."""
        return self.images.key_ids if self.images is not None else self.prompt_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def ended(self) -> bool:
        """Finished for its user (AWAITING_VERIFY or FINISHED): it gets no more tokens and is never scheduled."""
        return self.status is RequestStatus.AWAITING_VERIFY or self.status is RequestStatus.FINISHED

    def advance(self, status: RequestStatus) -> None:
        """Moves to `status`; anything but a transition of RequestStatus is an error."""
        if status not in _TRANSITIONS[self.status]:
            raise RuntimeError(f"request {self.request_id}: {self.status.value} -> {status.value} is not a transition")
        self.status = status

    def token_at(self, pos: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[pos] if pos < n else self.output_ids[pos - n]

    def tokens(self, start: int, end: int) -> list[int]:
        """The tokens of positions start..end-1 (prompt then output), by slicing."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[max(0, start - n) : end - n]

    def pending_tokens(self) -> list[int]:
        """Tokens whose KV is not stored yet (a prompt remainder, or the last sampled token)."""
        return self.tokens(self.num_computed, self.num_tokens)

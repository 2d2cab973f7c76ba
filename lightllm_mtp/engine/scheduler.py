"""CPU-side batching policy: continuous batching with chunked prefill under a per-step token budget.

Every step runs the decode row of each generating request and fills the rest of the budget with prompt
chunks (running requests mid-prompt first, then newly admitted ones). A request is admitted only when a
request slot is free and its worst-case KV need (prompt + max_new_tokens capped at max_model_len, plus the
runner's lookahead slots: MTP verify blocks opened ahead, a decode row queued for a request that just finished)
fits beside what running requests reserved, so a running request never runs out of KV slots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from lightllm_mtp.engine.request import Request, RequestStatus


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int


class Scheduler:
    def __init__(
        self,
        max_batch_size: int,
        token_budget: int,
        kv_capacity: int,
        max_model_len: int,
        tokens_per_step: int = 1,
        lookahead_slots: int = 0,
    ):
        self.max_batch_size = max_batch_size
        self.tokens_per_step = tokens_per_step  # budget one generating request costs per step (k + 1 under MTP)
        self.lookahead_slots = lookahead_slots
        self.token_budget = token_budget
        self.kv_capacity = kv_capacity
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.reserved = 0

    def kv_need(self, num_prompt_tokens: int, max_new_tokens: int) -> int:
        """KV slots a request may hold at once: its tokens up to max_model_len, plus the runner's lookahead."""
        return min(num_prompt_tokens + max_new_tokens, self.max_model_len) + self.lookahead_slots

    def check_fits(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        need = self.kv_need(num_prompt_tokens, max_new_tokens)
        if need > self.kv_capacity:
            raise ValueError(
                f"a request of {num_prompt_tokens} prompt tokens and max_new_tokens={max_new_tokens} needs {need} KV "
                f"slots; the pool has {self.kv_capacity}"
            )

    def add(self, req: Request) -> None:
        self.check_fits(len(req.prompt_ids), req.params.max_new_tokens)
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, skip: set[int] = frozenset()) -> list[ScheduledRequest]:
        """The next step. skip: ids of running requests to leave out (their last token is still on its way)."""
        budget = self.token_budget
        out: list[ScheduledRequest] = []
        for req in self.running:  # decode rows first (a verify block each under MTP)
            if not req.in_prefill and budget > 0 and id(req) not in skip:
                out.append(ScheduledRequest(req, 1))
                budget -= self.tokens_per_step
        for req in self.running:  # unfinished prompts
            if req.in_prefill and budget > 0:
                n = min(len(req.prompt_ids) - req.num_computed, budget)
                out.append(ScheduledRequest(req, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_size:
            req = self.waiting[0]
            need = self.kv_need(len(req.prompt_ids), req.params.max_new_tokens)
            if self.reserved + need > self.kv_capacity:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            req.reserved_tokens = need
            self.reserved += need
            self.running.append(req)
            n = min(len(req.prompt_ids), budget)
            out.append(ScheduledRequest(req, n))
            budget -= n
        return out

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self.reserved -= req.reserved_tokens
        req.reserved_tokens = 0
        req.status = RequestStatus.FINISHED

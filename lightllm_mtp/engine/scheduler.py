"""CPU-side batching policy: continuous batching with chunked prefill under a per-step token budget.

Every step runs the decode row of each generating request and fills the rest of the budget with prompt
chunks (running requests mid-prompt first, then newly admitted ones). A request is admitted only when a
request slot is free and its worst-case KV need (prompt + max_new_tokens capped at max_model_len, plus the
runner's lookahead slots: MTP verify blocks opened ahead, a decode row queued for a request that just finished)
fits beside what running requests reserved, so a running request never runs out of KV slots.

With the prefix cache a request resumes past its cached prefix: those slots are shared and locked in the tree, so
it reserves only the rest, and admission keeps reserved + locked tree slots within the pool (unlocked tree slots
are evicted on demand). Prompt chunks cut by the budget end on a snapshot boundary where they can. A request whose
grammar still compiles (in the background) is passed over, the requests behind it are not held up.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from lightllm_mtp.engine.prefix_cache import PrefixCache
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
        prefix_cache: PrefixCache | None = None,
    ):
        self.max_batch_size = max_batch_size
        self.tokens_per_step = tokens_per_step  # budget one generating request costs per step (k + 1 under MTP)
        self.lookahead_slots = lookahead_slots
        self.token_budget = token_budget
        self.kv_capacity = kv_capacity
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefix_cache = prefix_cache

    def kv_need(self, num_prompt_tokens: int, max_new_tokens: int) -> int:
        """KV slots a request may hold at once: its tokens up to max_model_len, plus the runner's lookahead."""
        return min(num_prompt_tokens + max_new_tokens, self.max_model_len) + self.lookahead_slots

    def check_fits(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        need = self.kv_need(num_prompt_tokens, max_new_tokens)
        if need > self.kv_capacity:  # refused before admission: a running request never runs out of KV slots
            raise ValueError(
                f"a request of {num_prompt_tokens} prompt tokens and max_new_tokens={max_new_tokens} needs {need} KV "
                f"slots (its tokens up to max_model_len {self.max_model_len}, plus {self.lookahead_slots} lookahead "
                f"slots); the pool has {self.kv_capacity}: lower max_new_tokens, or raise max_total_token_num / "
                "mem_fraction"
            )

    def add(self, req: Request) -> None:
        self.check_fits(len(req.prompt_ids), req.params.max_new_tokens)
        self.waiting.append(req)

    @property
    def reserved(self) -> int:
        """KV slots set aside for the running requests: each one's worst case (kv_need) less its positions the prefix
        cache's tree holds (shared, locked, counted by the tree)."""
        return sum(self.kv_need(len(r.prompt_ids), r.params.max_new_tokens) - r.cache_hold.cached_len
                   for r in self.running)  # fmt: skip

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
                n = self._chunk(req, budget)
                out.append(ScheduledRequest(req, n))
                budget -= n
        reserved = self.reserved if self.waiting else 0
        i = 0  # the first waiting request not passed over (those whose grammar still compiles are)
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_batch_size:
            req = self.waiting[i]
            if req.compiling is not None:
                i += 1
                continue
            cache = self.prefix_cache
            cached = cache.match(req) if cache is not None else 0
            need = self.kv_need(len(req.prompt_ids), req.params.max_new_tokens) - cached
            locked = cache.tree.num_locked if cache is not None else 0
            if reserved + need + locked > self.kv_capacity:
                if cache is not None:
                    cache.unmatch(req)
                break
            if cache is not None:
                cache.admitted(req)
            del self.waiting[i]
            req.advance(RequestStatus.RUNNING)
            self.running.append(req)
            reserved += need  # its reservation (kv_need less its tree positions)
            n = self._chunk(req, budget)
            out.append(ScheduledRequest(req, n))
            budget -= n
        return out

    def _chunk(self, req: Request, budget: int) -> int:
        """Prompt tokens of req's next chunk: what the budget allows, cut back to a snapshot boundary when the budget
        cuts the prompt."""
        left = len(req.prompt_ids) - req.num_computed
        if left <= budget or self.prefix_cache is None:
            return min(left, budget)
        interval = self.prefix_cache.interval
        end = (req.num_computed + budget) // interval * interval
        return end - req.num_computed if end > req.num_computed else budget

    def finish(self, req: Request) -> None:
        """req leaves its queue (engine/request_end.py): a running one's reservation goes with it."""
        if req in self.running:
            self.running.remove(req)
        else:
            self.waiting.remove(req)

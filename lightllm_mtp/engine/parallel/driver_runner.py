"""The driver's StepRunner under tp / pp: each call is described to the followers (step_ops.py), then run on the
driver's own shard. Launches go out at once (their forward's collectives need every rank); collects and releases
wait and go out with the next launch, in order. With the prefix cache it is the cache's journal: the cache calls
made outside the runner (the scheduler's match / unmatch, a request's finish, a dropped step's settle, evict_all)
queue the same way, so every follower's copy of the tree sees the driver's calls in the driver's order."""

from __future__ import annotations

import random

import torch

from lightllm_mtp.engine.parallel.group import ParallelGroup
from lightllm_mtp.engine.parallel.step_ops import (
    KEEP_STEPS, Collect, EvictAll, Finish, Launch, Match, NewRequest, Release, SaveState, Settle, StepOp, Unmatch,
)
from lightllm_mtp.engine.prefix_cache import PrefixCache
from lightllm_mtp.engine.request import Request
from lightllm_mtp.engine.scheduler import ScheduledRequest
from lightllm_mtp.engine.step import LaunchedStep, StepRunner


class DriverRunner:
    def __init__(self, runner: StepRunner, group: ParallelGroup, device: torch.device):
        self.runner = runner
        self.group = group
        self.device = device
        self.max_tokens_per_step = runner.max_tokens_per_step
        self.lookahead_slots = runner.lookahead_slots
        self._pending: list[StepOp] = []
        self._known: set[int] = set()  # request ids the followers hold
        self._seq = 0
        self._seq_of: dict[int, int] = {}  # id(launched step) -> its launch number
        self.prefix_cache: PrefixCache | None = None  # the driver's (engine/prefix_cache.py), journaled here

    def launch(self, scheduled: list[ScheduledRequest], after: LaunchedStep | None = None) -> LaunchedStep:
        new = [self._introduce(s.request) for s in scheduled if s.request.request_id not in self._known]
        self._seq += 1
        op = Launch(
            seq=self._seq,
            after=self._seq_of.get(id(after)) if after is not None else None,
            scheduled=[(s.request.request_id, s.num_new_tokens) for s in scheduled],
            new_requests=new,
            cache_digest=self.prefix_cache.digest() if self.prefix_cache is not None else None,
        )
        self.group.send(self._pending + [op])
        self._pending = []
        step = self._guarded(lambda: self.runner.launch(scheduled, after=after))
        self._seq_of = {k: v for k, v in self._seq_of.items() if v > self._seq - KEEP_STEPS}
        self._seq_of[id(step)] = self._seq
        return step

    def collect(self, step: LaunchedStep) -> list[tuple[Request, list[int]]]:
        self._pending.append(Collect(self._seq_of.pop(id(step))))
        return self._guarded(lambda: self.runner.collect(step))

    def release(self, req: Request) -> None:
        if req.request_id in self._known:
            self._pending.append(Release(req.request_id))
            self._known.discard(req.request_id)
        self.runner.release(req)

    def committed_state_offset(self, req: Request, back: int = 0):
        return self.runner.committed_state_offset(req, back)

    def hold_queued_row(self, req: Request):
        return self.runner.hold_queued_row(req)

    def settle(self, step: LaunchedStep) -> None:
        self._pending.append(Settle(self._seq_of[id(step)]))
        self._guarded(lambda: self.runner.settle(step))

    # ---- the prefix cache's journal (followers replay each call on their copy) --------------------------------
    def journal(self, cache: PrefixCache) -> None:
        self.prefix_cache = cache
        cache.journal = self

    def cache_match(self, req: Request) -> None:
        new = self._introduce(req) if req.request_id not in self._known else None
        self._pending.append(Match(req.request_id, new))

    def cache_unmatch(self, req: Request) -> None:
        self._pending.append(Unmatch(req.request_id))

    def cache_finish(self, req: Request) -> None:
        self._pending.append(Finish(req.request_id, len(req.output_ids)))

    def cache_evict_all(self) -> None:
        self._pending.append(EvictAll())

    def save_state(self, directory: str, save_own) -> None:
        """Every rank writes its cached state to `directory`/rank{r}.pt; save_own(directory) writes the driver's."""
        self.group.send(self._pending + [SaveState(str(directory))])
        self._pending = []
        save_own(directory)
        self.group.barrier()

    def shutdown(self) -> None:
        self.group.shutdown()

    def _introduce(self, req: Request) -> NewRequest:
        """A request the followers have not seen; a sampled one without a seed gets a generator here, so that
        every rank draws the same tokens."""
        self._known.add(req.request_id)
        seed = req.params.seed
        if req.params.temperature > 0 and req.generator is None:
            seed = random.getrandbits(63)
            req.generator = torch.Generator(device=self.device).manual_seed(seed)
        sampled = req.params.temperature > 0
        return NewRequest(req.request_id, list(req.prompt_ids), req.params, seed if sampled else None)

    def _guarded(self, call):
        """Any failure on the driver mid-step leaves the ranks out of step (followers may wait inside a forward):
        the whole group ends."""
        try:
            return call()
        except Exception as e:
            self.group.fail(e)

"""The driver's step ops on their way to the followers (step_ops.py), in the driver's order: its runner's collects and
releases, and the prefix cache's calls made outside the runner (the scheduler's match / unmatch, evict_all), wait here
until the next launch (or save / stop) sends them ahead of itself. It also knows which requests the followers hold."""

from __future__ import annotations

import random

import torch

from lightllm_mtp.engine.parallel.step_ops import EvictAll, Match, NewRequest, StepOp, Unmatch
from lightllm_mtp.engine.request import Request


class StepJournal:
    def __init__(self, device: torch.device):
        self.device = device
        self.pending: list[StepOp] = []
        self.known: set[int] = set()  # request ids the followers hold

    def add(self, op: StepOp) -> None:
        self.pending.append(op)

    def take(self) -> list[StepOp]:
        """The ops not sent yet, in order; the journal is empty afterwards."""
        ops, self.pending = self.pending, []
        return ops

    def introduce(self, req: Request) -> NewRequest:
        """A request the followers have not seen; a sampled one without a seed gets a generator here, so that
        every rank draws the same tokens."""
        self.known.add(req.request_id)
        seed = req.params.seed
        if req.params.temperature > 0 and req.generator is None:
            seed = random.getrandbits(63)
            req.generator = torch.Generator(device=self.device).manual_seed(seed)
        sampled = req.params.temperature > 0
        images = req.images.images if req.images is not None else ()
        return NewRequest(req.request_id, list(req.prompt_ids), req.params, seed if sampled else None, images)

    # ---- the prefix cache's calls (engine/prefix_cache.py CacheJournal) -----------------------------------------
    def cache_match(self, req: Request) -> None:
        new = self.introduce(req) if req.request_id not in self.known else None
        self.add(Match(req.request_id, new))

    def cache_unmatch(self, req: Request) -> None:
        self.add(Unmatch(req.request_id))

    def cache_evict_all(self) -> None:
        self.add(EvictAll())

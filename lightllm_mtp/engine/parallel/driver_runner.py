"""The driver's StepRunner under tp / pp: each call is described to the followers (step_ops.py), then run on the
driver's own shard. Launches go out at once (their forward's collectives need every rank); collects and releases
wait and go out with the next launch, in order."""

from __future__ import annotations

import random

import torch

from lightllm_mtp.engine.parallel.group import ParallelGroup
from lightllm_mtp.engine.parallel.step_ops import KEEP_STEPS, Collect, Launch, NewRequest, Release, SaveState, StepOp
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

    def launch(self, scheduled: list[ScheduledRequest], after: LaunchedStep | None = None) -> LaunchedStep:
        new = [self._introduce(s.request) for s in scheduled if s.request.request_id not in self._known]
        self._seq += 1
        op = Launch(
            seq=self._seq,
            after=self._seq_of.get(id(after)) if after is not None else None,
            scheduled=[(s.request.request_id, s.num_new_tokens) for s in scheduled],
            new_requests=new,
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

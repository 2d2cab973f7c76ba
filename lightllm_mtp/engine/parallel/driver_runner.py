"""The driver's StepRunner under tp / pp: each call is described to the followers (step_ops.py), then run on the
driver's own shard. Launches go out at once (their forward's collectives need every rank); collects and releases
wait in the StepJournal and go out with the next launch, in order, behind the prefix cache's calls made outside the
runner (the scheduler's match / unmatch, evict_all), which the cache records in the same journal, so every follower's
copy of the tree sees the driver's calls in the driver's order. A release carries the request's output length as the
driver cut it: the followers end the request (engine/request_end.py) as the driver did. A structured output's grammar
is sent the moment its request arrives (compile_grammar), so that the last stage's ranks compile it while the
driver's own compilation runs."""

from __future__ import annotations

from lightllm_mtp.engine.parallel.group import ParallelGroup
from lightllm_mtp.engine.parallel.journal import StepJournal
from lightllm_mtp.engine.parallel.step_ops import (
    KEEP_STEPS, Collect, CompileGrammar, Launch, Release, SaveState, Settle,
)
from lightllm_mtp.engine.prefix_cache import PrefixCache
from lightllm_mtp.engine.request import EndState, Request
from lightllm_mtp.engine.scheduler import ScheduledRequest
from lightllm_mtp.engine.step import LaunchedStep, StepRunner
from lightllm_mtp.sampling_params import StructuredOutput


class DriverRunner:
    def __init__(self, runner: StepRunner, group: ParallelGroup, journal: StepJournal,
                 prefix_cache: PrefixCache | None = None):  # fmt: skip
        """journal: the one the driver's prefix cache (when on) was built with."""
        self.runner = runner
        self.group = group
        self.journal = journal
        self.prefix_cache = prefix_cache  # its digest goes with every launch
        self.max_tokens_per_step = runner.max_tokens_per_step
        self.lookahead_slots = runner.lookahead_slots
        self._seq = 0
        self._seq_of: dict[int, int] = {}  # id(launched step) -> its launch number

    def launch(self, scheduled: list[ScheduledRequest], after: LaunchedStep | None = None) -> LaunchedStep:
        known = self.journal.known
        new = [self.journal.introduce(s.request) for s in scheduled if s.request.request_id not in known]
        self._seq += 1
        op = Launch(
            seq=self._seq,
            after=self._seq_of.get(id(after)) if after is not None else None,
            scheduled=[(s.request.request_id, s.num_new_tokens) for s in scheduled],
            new_requests=new,
            cache_digest=self.prefix_cache.digest() if self.prefix_cache is not None else None,
        )
        self.group.send(self.journal.take() + [op])
        step = self._guarded(lambda: self.runner.launch(scheduled, after=after))
        self._seq_of = {k: v for k, v in self._seq_of.items() if v > self._seq - KEEP_STEPS}
        self._seq_of[id(step)] = self._seq
        return step

    def collect(self, step: LaunchedStep) -> list[tuple[Request, list[int]]]:
        self.journal.add(Collect(self._seq_of.pop(id(step))))
        return self._guarded(lambda: self.runner.collect(step))

    def release(self, req: Request) -> None:
        if req.request_id in self.journal.known:
            self.journal.add(Release(req.request_id, len(req.output_ids)))
            self.journal.known.discard(req.request_id)
        self.runner.release(req)

    def end_state(self, req: Request) -> EndState:
        return self.runner.end_state(req)

    def settle(self, step: LaunchedStep) -> None:
        self.journal.add(Settle(self._seq_of[id(step)]))
        self._guarded(lambda: self.runner.settle(step))

    def compile_grammar(self, so: StructuredOutput) -> None:
        """The followers that choose tokens start compiling `so` now (behind the ops waiting in the journal)."""
        self.group.send(self.journal.take() + [CompileGrammar.of(so)])

    def save_state(self, directory: str, save_own) -> None:
        """Every rank writes its cached state to `directory`/rank{r}.pt; save_own(directory) writes the driver's."""
        self.group.send(self.journal.take() + [SaveState(str(directory))])
        save_own(directory)
        self.group.barrier()

    def shutdown(self) -> None:
        self.group.shutdown()

    def _guarded(self, call):
        """Any failure on the driver mid-step leaves the ranks out of step (followers may wait inside a forward):
        the whole group ends."""
        try:
            return call()
        except Exception as e:
            self.group.fail(e)

"""A follower rank: builds its shard of the model and runner, then replays the driver's step ops (step_ops.py)
until Stop. It never schedules: the requests it holds are mirrors of the driver's, updated by the same runner
calls (launch, collect, settle) in the same order, and ended by the same path (engine/request_end.py). On the last
pipeline stage (where tokens are chosen) a mirror with a structured output holds its own matcher of the same grammar,
advanced by the tokens each Collect brings, so its masks (sampling, verify rows, drafts) are the driver's. Its prefix
cache (when on) is a copy of the driver's: the same calls in the same order on the same slot counts (every choice the
tree makes, LRU eviction included, is a deterministic function of them), checked against the driver's digest before
every launch."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.parallel_config import RankInfo
from lightllm_mtp.engine.parallel.membership import (
    describe, exchange_status, join_group, leave_group, recv_ops, watch_parent,
)
from lightllm_mtp.engine.parallel.stage_state import stage_state
from lightllm_mtp.engine.parallel.step_ops import (
    KEEP_STEPS, Collect, CompileGrammar, EvictAll, Launch, Match, NewRequest, Release, SaveState, Settle, Stop, Unmatch,
)
from lightllm_mtp.engine.pending_grammars import model_grammar_compiler
from lightllm_mtp.engine.request import Request, RequestStatus
from lightllm_mtp.engine.request_end import end_request
from lightllm_mtp.engine.runner_factory import BuiltRunner, build_runner, rank_args
from lightllm_mtp.engine.scheduler import ScheduledRequest
from lightllm_mtp.multimodal.prompt_images import PromptImages
from lightllm_mtp.sampling.grammar_compiler import GrammarCompiler

def follower_main(args: EngineArgs, rank: int, link: tuple[int, str, bool], num_threads: int, started) -> None:
    """link: (rendezvous port, backend, host_staged), as the driver decided them."""
    started.set()  # the spawned process got here: the driver may rendezvous
    watch_parent()
    port, backend, host_staged = link
    args = rank_args(args, rank, shared_device=host_staged)
    if args.device.type == "cpu":
        torch.set_num_threads(num_threads)
    control = join_group(args, rank, port, backend, host_staged)
    status, built = "ok", None
    try:
        cfg = args.model_config()
        built = build_runner(args, cfg, args.resolved_max_model_len(cfg),
                             RankInfo(args.parallel, rank))  # fmt: skip
    except Exception as e:
        status = describe(e)
    if any(s != "ok" for s in exchange_status(control, status)):
        leave_group()
        sys.exit(1)
    grammars = None
    if built.model.is_last_stage:  # the ranks that choose tokens mask them
        grammars = model_grammar_compiler(args.model_dir, cfg.vocab_size, built.model_runner.eos_token_ids)
    Follower(built, args.device, rank, grammars).run(control)
    leave_group()


class Follower:
    def __init__(self, built: BuiltRunner, device: torch.device, rank: int, grammars: GrammarCompiler | None = None):
        """grammars: the structured outputs' compiler on a rank that chooses tokens (None: this rank does not)."""
        self.built = built
        self.runner = built.runner
        self.cache = built.prefix_cache
        self.device = device
        self.rank = rank
        self.grammars = grammars
        self.requests: dict[int, Request] = {}
        self.steps: dict[int, object] = {}

    def run(self, control) -> None:
        while True:
            for op in recv_ops(control):
                if isinstance(op, Stop):
                    return
                self.apply(op)
                if isinstance(op, SaveState):
                    dist.barrier(group=control)  # the driver reads the files after it

    @torch.inference_mode()
    def apply(self, op) -> None:
        if isinstance(op, Launch):
            for new in op.new_requests:
                self._add(new)
            if self.cache is not None and self.cache.digest() != op.cache_digest:
                raise RuntimeError(f"rank {self.rank}: prefix cache diverged from the driver's before launch {op.seq}: "
                                   f"{self.cache.digest()} != {op.cache_digest} (free KV, tree, locked, snapshots, "
                                   "host snapshots, free request slots)")  # fmt: skip
            scheduled = [ScheduledRequest(self.requests[rid], n) for rid, n in op.scheduled]
            for s in scheduled:  # the driver admitted it
                if s.request.status is RequestStatus.WAITING:
                    s.request.advance(RequestStatus.RUNNING)
            after = self.steps.get(op.after) if op.after is not None else None
            self.steps[op.seq] = self.runner.launch(scheduled, after=after)
            for seq in [s for s in self.steps if s <= op.seq - KEEP_STEPS]:
                del self.steps[seq]
        elif isinstance(op, Collect):
            for req, tokens in self.runner.collect(self.steps.pop(op.seq)):
                if not req.ended:
                    req.output_ids.extend(tokens)
                    if req.grammar is not None:  # past the driver's cut too: those tokens were masked alike
                        for token in tokens:
                            req.grammar.advance(token)
        elif isinstance(op, Release):
            req = self.requests.pop(op.request_id)
            assert len(req.output_ids) >= op.num_output_tokens, (op, len(req.output_ids))
            del req.output_ids[op.num_output_tokens :]  # the driver's cut at a stop token or length limit
            end_request(req, self.runner, self.cache)
        elif isinstance(op, Settle):
            self.runner.settle(self.steps[op.seq])
        elif isinstance(op, SaveState):
            save_stage_state(self.built, op.directory, self.rank)
        elif isinstance(op, CompileGrammar):
            if self.grammars is not None:
                self.grammars.compile(op.structured)  # in the background; a grammar that fails is never launched
        else:
            self._apply_cache_op(op)

    def _add(self, new: NewRequest) -> None:
        generator = None
        if new.generator_seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(new.generator_seed)
        images = None
        if new.images:  # the driver checked them against this model (LLMEngine.validate_images)
            images = PromptImages.of(list(new.prompt_ids), new.images, self.built.model.cfg.vision.image_token_id)
        req = Request(new.request_id, list(new.prompt_ids), new.params, generator, images=images)
        if new.params.structured is not None and self.grammars is not None:
            req.grammar = self.grammars.matcher(new.params.structured)  # compiled since CompileGrammar (or now)
        self.requests[new.request_id] = req

    def _apply_cache_op(self, op) -> None:
        """The prefix cache's calls made outside the runner, as the driver made them (engine/scheduler.py)."""
        if isinstance(op, Match):
            if op.new_request is not None:
                self._add(op.new_request)
            self.cache.match(self.requests[op.request_id])
        elif isinstance(op, Unmatch):
            self.cache.unmatch(self.requests[op.request_id])
        elif isinstance(op, EvictAll):
            self.cache.evict_all()
        else:
            raise TypeError(f"unknown step op {op!r}")


def save_stage_state(built: BuiltRunner, directory: str, rank: int) -> None:
    torch.save(stage_state(built.model, built.runner, built.prefix_cache), Path(directory) / f"rank{rank}.pt")

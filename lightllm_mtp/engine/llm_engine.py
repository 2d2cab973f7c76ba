"""LLMEngine: model + scheduler + runner; one `step()` is one forward of the running batch."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.model_config import ModelConfig
from lightllm_mtp.engine.parallel.driver_runner import DriverRunner
from lightllm_mtp.engine.parallel.follower import save_stage_state
from lightllm_mtp.engine.parallel.group import ParallelGroup
from lightllm_mtp.engine.parallel.journal import StepJournal
from lightllm_mtp.engine.parallel.membership import describe
from lightllm_mtp.engine.runner_factory import BuiltRunner, build_runner
from lightllm_mtp.engine.step import LaunchedStep
from lightllm_mtp.engine.cache_budget import cache_budget_of
from lightllm_mtp.engine.pending_grammars import PendingGrammars
from lightllm_mtp.engine.prefix_cache import PrefixCacheStats
from lightllm_mtp.engine.request import FinishReason, Request
from lightllm_mtp.engine.request_end import end_request
from lightllm_mtp.engine.scheduler import Scheduler
from lightllm_mtp.multimodal.image_input import ImageInput
from lightllm_mtp.multimodal.prompt_images import PromptImages
from lightllm_mtp.sampling.grammar import grammar_text
from lightllm_mtp.sampling_params import SamplingParams


GRAMMAR_WAIT_S = 0.02  # an idle step's wait for a grammar compiling in the background (a worker then reads its inbox)


@dataclass(frozen=True)
class StepOutput:
    """What one step did to one request: the tokens it appended (several with MTP) and whether it finished."""

    request: Request
    new_token_ids: list[int]
    finished: bool
    new_logprobs: list | None = None  # params.logprobs: one (logprob, top pairs) per new token


@dataclass(frozen=True)
class EngineUsage:
    """Occupancy of the engine's pools and queues (server metrics; all zero-used when idle)."""

    kv_used: int  # KV pool token slots held by requests (draft blocks included)
    kv_capacity: int
    kv_reserved: int  # KV slots the scheduler set aside for running requests (worst case)
    req_slots_used: int
    req_slots_capacity: int
    running: int
    waiting: int
    kv_cached: int = 0  # KV slots owned by the prefix cache (those not locked by a request are reclaimable)


class LLMEngine:
    def __init__(self, args: EngineArgs):
        self.args = args
        self.model_config = cfg = args.model_config()
        if args.device.type == "cpu":  # tp / pp followers take the driver's count (engine/parallel/group.py)
            torch.set_num_threads(args.resolved_cpu_threads(cfg.hidden_size, args.parallel.world_size))
        self.max_model_len = args.resolved_max_model_len(cfg)
        self.cache_budget = budget = cache_budget_of(args, cfg, self.max_model_len)
        kv_pool_size = budget.kv_tokens
        self.spec = args.spec
        self.parallel_group = journal = None
        if args.parallel.world_size > 1:  # tp x pp: this process is rank 0, the driver (engine/parallel/)
            args.parallel.check_model(cfg)
            self.parallel_group = ParallelGroup(args)
            journal = StepJournal(args.device)  # the ops the followers replay, the prefix cache's calls among them
        built = self._build(args, cfg, journal)
        self.model, self.model_runner, self.runner = built.model, built.model_runner, built.runner
        self._built = built
        self.prefix_cache = built.prefix_cache
        if self.parallel_group is not None:
            self.runner = DriverRunner(built.runner, self.parallel_group, journal, self.prefix_cache)
        self.scheduler = Scheduler(
            args.max_batch_size,
            args.chunked_prefill_size,
            kv_pool_size,
            self.max_model_len,
            tokens_per_step=self.runner.max_tokens_per_step,
            lookahead_slots=self.runner.lookahead_slots,
            prefix_cache=self.prefix_cache,
        )
        self.eos_token_ids = built.model_runner.eos_token_ids
        self._ids = itertools.count()
        self.overlap = not args.disable_overlap
        self._inflight: LaunchedStep | None = None  # a step queued on the device whose tokens are not read yet
        self.grammars = PendingGrammars(args.model_dir, cfg.vocab_size, self.eos_token_ids)

    def _build(self, args: EngineArgs, cfg: ModelConfig, journal: StepJournal | None) -> BuiltRunner:
        if self.parallel_group is None:
            return build_runner(args, cfg, self.max_model_len)
        try:
            built = build_runner(args, cfg, self.max_model_len, journal=journal)
        except Exception as e:
            try:
                self.parallel_group.check_start(describe(e))
            except Exception as group_error:
                raise group_error from e
            raise
        self.parallel_group.check_start("ok")
        return built

    def save_state(self, directory: str | Path) -> None:
        """Every rank writes its cached state (KV, conv windows, SSM rows, page table, DraftState by global layer)
        to directory/rank{r}.pt (engine/parallel/stage_state.py); tests compare layouts with it."""
        if isinstance(self.runner, DriverRunner):
            self.runner.save_state(str(directory), lambda d: save_stage_state(self._built, d, 0))
        else:
            save_stage_state(self._built, str(directory), 0)

    def shutdown(self) -> None:
        """Ends the follower ranks of a tp / pp engine (nothing to do for a single-process one)."""
        if self.parallel_group is not None:
            self.parallel_group.shutdown()

    def evict_prefix_cache(self) -> None:
        """Drops every unlocked cached prefix (its KV slots and snapshots go back to their pools)."""
        if self.prefix_cache is not None:
            self.prefix_cache.evict_all()

    @property
    def spec_controller(self):
        """Adaptive speculation's SpecLengthController (None without mtp_adaptive)."""
        return getattr(self._built.runner, "controller", None)

    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        return self.prefix_cache.stats() if self.prefix_cache is not None else None

    def validate_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; max_model_len is {self.max_model_len} "
                "(the prompt must leave room for at least one generated token)"
            )
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {vocab}): {bad[:8]}")

    def validate_images(self, prompt_ids: list[int], images: Sequence[ImageInput]) -> PromptImages | None:
        """The prompt's images as the engine keeps them (None without images); ValueError when this engine takes no
        images, there are more than limit_mm_per_prompt, or the prompt's image tokens do not match them (each image
        placeholder expanded to its image's token count: multimodal.image_input.expand_image_tokens)."""
        vision = self.model_config.vision
        if not images:
            if vision is not None and vision.image_token_id in prompt_ids:
                raise ValueError(f"the prompt has image tokens ({vision.image_token_id}) but no images")
            return None
        if vision is None:
            raise ValueError(self.args.images_refused_because(self.args.model_config_as_declared()))
        if len(images) > self.args.limit_mm_per_prompt:
            raise ValueError(f"{len(images)} images in one request; at most {self.args.limit_mm_per_prompt} "
                             "(--limit_mm_per_prompt)")  # fmt: skip
        if any(not isinstance(image, ImageInput) for image in images):
            raise TypeError("images must be ImageInput (multimodal.image_processor's output)")
        for image in images:  # one made by another processor would fail in the tower, inside every later step
            if image.pixel_values.shape[1] != vision.patch_dim or image.merge_size != vision.spatial_merge_size:
                raise ValueError(f"an image of {image.pixel_values.shape[1]} values a patch, merge {image.merge_size}: "
                                 f"this model's tower takes {vision.patch_dim} values a patch, merge "
                                 f"{vision.spatial_merge_size} (this checkpoint's image processor makes them)")
        return PromptImages.of(list(prompt_ids), images, vision.image_token_id)

    def validate_request(self, prompt_ids: list[int], params: SamplingParams, images: Sequence[ImageInput] = (),
                         grammar: bool = True) -> PromptImages | None:  # fmt: skip
        """Everything add_request would reject, checked without queuing anything; returns the prompt's images.
        grammar: also the structured output's syntax (add_request leaves it to the background compilation: a bad
        one finishes with an error)."""
        self.validate_prompt(prompt_ids)
        prompt_images = self.validate_images(prompt_ids, images)
        bad = [t for t, _ in params.logit_bias if t >= self.model_config.vocab_size]
        if bad:
            raise ValueError(f"logit_bias token ids out of range [0, {self.model_config.vocab_size}): {bad[:8]}")
        if params.structured is not None and grammar:
            grammar_text(params.structured)  # ValueError naming what is wrong
        self.scheduler.check_fits(len(prompt_ids), params.max_new_tokens)
        return prompt_images

    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    images: Sequence[ImageInput] = ()) -> Request:  # fmt: skip
        """Queues a request. prompt_ids: with each image's placeholder expanded to its tokens (expand_image_tokens),
        images in order. One with a structured output waits (WAITING) while its grammar compiles in the background;
        the steps of the others go on meanwhile."""
        prompt_images = self.validate_request(prompt_ids, params, images, grammar=False)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.args.device).manual_seed(params.seed)
        req = Request(request_id=next(self._ids), prompt_ids=list(prompt_ids), params=params, generator=generator,
                      images=prompt_images)  # fmt: skip
        if params.structured is not None:
            self.grammars.start(req)
            if isinstance(self.runner, DriverRunner):  # tp / pp: the ranks that choose tokens compile it too
                self.runner.compile_grammar(params.structured)
        self.scheduler.add(req)
        return req

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Request]:
        """Runs one step; returns the requests that finished in it."""
        return [o.request for o in self.step_outputs() if o.finished]

    def step_outputs(self) -> list[StepOutput]:
        """Runs one step; returns every request that got tokens in it (for streaming), finished ones flagged.

        With overlap (the default), the next step is queued on the device before this one's results are read: the
        scheduler's next step, without the requests this step certainly ends (by length; with the prefix cache also
        those it may end: `_launch_next`). Decode / verify rows take
        their inputs from the device (plain decoding: this step's sampled tokens; MTP: the blocks the proposer
        opened), prompt chunks from the host. The host then does this step's bookkeeping while the device runs the
        next one. A request that stops in this step (a stop token, eos) wastes its rows of the queued step; `collect`
        skips them. Requests whose grammar compiles in the background are not scheduled until it is done; with
        nothing else to run, the step waits a little for one (GRAMMAR_WAIT_S)."""
        outputs = self._compiled_grammars() if self.grammars else []
        if self._inflight is None:
            scheduled = self.scheduler.schedule()
            if not scheduled:
                if self.grammars:
                    return outputs + self._compiled_grammars(wait_s=GRAMMAR_WAIT_S)
                if self.scheduler.waiting:
                    raise RuntimeError("scheduler made no progress: no request fits the KV pool or the token budget")
                return outputs
            self._inflight = self.runner.launch(scheduled)
        step = self._inflight
        self._inflight = self._launch_next(step) if self.overlap else None
        for req, tokens in self.runner.collect(step):
            if req.ended:  # aborted, or stopped in the step before: a wasted row
                continue
            new: list[int] = []
            finished = False
            logprobs, req.pending_logprobs = req.pending_logprobs, None
            for token in tokens:  # an accepted MTP block may end early at a stop token or a length limit
                req.output_ids.append(token)
                if req.grammar is not None:
                    req.grammar.advance(token)
                if logprobs is not None:
                    req.output_logprobs.append(logprobs[len(new)])
                new.append(token)
                reason = self._finish_reason(req, token)
                if reason is not None:
                    self._finish(req, reason)
                    finished = True
                    break
            outputs.append(StepOutput(req, new, finished, logprobs[: len(new)] if logprobs is not None else None))
        self._drop_idle_inflight()
        return outputs

    def _compiled_grammars(self, wait_s: float = 0.0) -> list[StepOutput]:
        """Requests whose grammar compiled may be scheduled from now; those whose grammar did not are finished."""
        failed = self.grammars.collect(wait_s)
        for req in failed:
            self._finish(req, FinishReason.ERROR)
        return [StepOutput(req, [], True) for req in failed]

    def _launch_next(self, step: LaunchedStep) -> LaunchedStep | None:
        """The step after `step`, queued before `step`'s results reach the host; None when there is nothing to run.
        Left out: the requests `step` certainly ends (by length); with the prefix cache also those it may end (MTP:
        within the k+1 tokens a verify can bring of their limit). Such a request then ends with nothing queued, so its
        committed state is the host's and its end snapshot joins the tree (the next turn of a conversation resumes
        past its answer); one that does not end skips one step."""
        near = self.runner.max_tokens_per_step if self.prefix_cache is not None else 1
        # also left out: requests whose next token depends on their committed output (penalties, min_tokens): they
        # wait for this step's results (their own only)
        ends = {id(r) for r in step.reqs if self._room(r) <= near or r.params.reads_history}
        scheduled = self.scheduler.schedule(skip=ends)
        return self.runner.launch(scheduled, after=step) if scheduled else None

    def _room(self, req: Request) -> int:
        """Tokens the request may still get (by its length limits), as the host knows it."""
        return min(req.params.max_new_tokens - len(req.output_ids), self.max_model_len - req.num_tokens)

    def _drop_idle_inflight(self) -> None:
        """Forgets a queued step whose requests all finished (its device work completes unobserved; every slot it
        touches was released and is reused only by work queued after it)."""
        if self._inflight is not None and all(r.ended for r in self._inflight.reqs):
            if self.prefix_cache is not None:  # requests awaiting its verify results (AWAITING_VERIFY)
                self.runner.settle(self._inflight)
            self._inflight = None

    def abort(self, req: Request) -> None:
        """Drops a request now: a running one returns its KV slots (draft block included) and request slot."""
        if req in self.scheduler.waiting:  # it holds nothing (tp / pp: the followers forget it)
            self._finish(req, FinishReason.ABORT)
        elif req in self.scheduler.running:
            self._finish(req, FinishReason.ABORT)
            self._drop_idle_inflight()

    def usage(self) -> EngineUsage:
        kv, reqs = self.model_runner.kv_pool, self.model_runner.req_manager
        cached = self.prefix_cache.tree if self.prefix_cache is not None else None
        return EngineUsage(
            kv_used=kv.size - kv.num_free - (cached.num_evictable if cached is not None else 0),
            kv_capacity=kv.size,
            kv_reserved=self.scheduler.reserved,
            req_slots_used=reqs.max_reqs - reqs.num_free,
            req_slots_capacity=reqs.max_reqs,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_cached=cached.num_tokens if cached is not None else 0,
        )

    def _finish_reason(self, req: Request, token: int) -> FinishReason | None:
        p = req.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return FinishReason.STOP
        if len(req.output_ids) >= p.max_new_tokens or req.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _finish(self, req: Request, reason: FinishReason) -> None:
        """Its committed KV and state join the prefix cache's tree, then its slots and reservation go back."""
        req.finish_reason = reason
        end_request(req, self.runner, self.prefix_cache, self.scheduler)

"""One timed static-batch generation through LLMEngine.step (benchmark/static_inference.py): prefill, then the steps in
which every request runs a decode row (under MTP a full verify block of k drafts), each timed between consecutive
returns of step(); and, when no step had every request in it, why."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from benchmark.timing import calls_ms, sync
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.sampling_params import SamplingParams


@dataclass
class GenRecord:
    batch_size: int
    prefill_ms: float = 0.0
    prefill_forwards: int = 0
    e2e_ms: float = 0.0
    step_ms: list[float] = field(default_factory=list)  # full-batch decode (or verify) steps
    step_context: list[float] = field(default_factory=list)  # mean KV length per request after each such step
    verify_ms: list[float] = field(default_factory=list)
    draft_ms: list[float] = field(default_factory=list)
    draft_calls: list[int] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    accepted_per_step: float | None = None
    max_running: int = 0  # most requests running at once
    tokens_left_after_prefill: int | None = None  # least output tokens a request had left when every prompt was done
    no_full_step_reason: str | None = None  # why no step had every request in it (None: some step had)


def why_no_full_step(rec: GenRecord, scheduler, prompt_len: int, output_len: int, k: int) -> str:
    """Why no step of rec ran all its requests with a decode row (k = 0) or a full verify block of k drafts each."""
    bs = rec.batch_size
    if rec.max_running < bs:
        need = scheduler.kv_need(prompt_len, output_len)
        limits = [f"max_batch_size {scheduler.max_batch_size}"] if scheduler.max_batch_size < bs else []
        if scheduler.kv_capacity < bs * need:
            limits.append(f"the KV pool's {scheduler.kv_capacity} token slots hold {scheduler.kv_capacity // need} "
                          f"requests of {need} (prompt + output + {scheduler.lookahead_slots} lookahead slots)")  # fmt: skip
        if not limits:  # admitted chunk by chunk under the token budget, and the first ones were done by then
            limits = [f"the first requests finished before the last was admitted (output_len {output_len} too short "
                      f"for the chunked prefill of {bs} x {prompt_len} tokens)"]  # fmt: skip
        return f"at most {rec.max_running} of {bs} requests ran at once: " + "; ".join(limits)
    rows = scheduler.tokens_per_step
    if -(-scheduler.token_budget // rows) < bs:
        return (f"the step's token budget ({scheduler.token_budget}, --chunked_prefill_size) holds "
                f"{-(-scheduler.token_budget // rows)} blocks of {rows} rows, not {bs}")  # fmt: skip
    needed = 2 * k + 2 if k else 1
    left = rec.tokens_left_after_prefill
    if left is None:
        return (f"output_len {output_len} too short: requests finished before the last prompt of {bs} x {prompt_len} "
                f"tokens was complete")  # fmt: skip
    return (f"output_len {output_len} too short: when the last prompt was complete a request had {left} tokens left; "
            f"a timed {'verify' if k else 'decode'} step needs {needed}")  # fmt: skip


def generate(engine: LLMEngine, prompts: list[list[int]], output_len: int, timers=None, k: int = 0) -> GenRecord:
    dev = engine.args.device
    params = SamplingParams(temperature=0.0, max_new_tokens=output_len, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in prompts]
    bs = len(prompts)
    rec = GenRecord(bs)
    sched = engine.scheduler
    sync(dev)
    t0 = last_return = time.perf_counter()
    timed_calls = []
    rows_fit = -(-sched.token_budget // sched.tokens_per_step)  # decode rows (verify blocks) one step schedules
    while engine.has_unfinished():
        running = sched.running
        rec.max_running = max(rec.max_running, len(running))
        in_prefill = bool(sched.waiting) or any(r.in_prefill for r in running)
        full = not in_prefill and len(running) == bs and bs <= rows_fit
        if not in_prefill and len(running) == bs and rec.tokens_left_after_prefill is None:
            rec.tokens_left_after_prefill = min(r.params.max_new_tokens - len(r.output_ids) for r in running)
        if full and k:  # a verify block now (always k drafts far from max_model_len), and room for the next one
            full = all(r.blocks and r.params.max_new_tokens - len(r.output_ids) >= 2 * k + 2 for r in running)
        if full:
            extra = k  # KV length after a verify step: num_tokens - 1 + (k + 1)
            context = sum(r.num_tokens + extra for r in running) / bs
        engine.step()
        if in_prefill:
            sync(dev)
        end = time.perf_counter()
        calls = (timers[0].take(), timers[1].take()) if timers is not None else None
        if in_prefill:
            rec.prefill_forwards += 1
            rec.prefill_ms = (end - t0) * 1e3
        elif full:
            # no synchronize between decode steps: with overlap scheduling the engine queues the next step before
            # it reads this one's tokens, so the time between two returns of step() is the steady-state step time
            rec.step_ms.append((end - last_return) * 1e3)
            rec.step_context.append(context)
            timed_calls.append(calls)
        last_return = end
    sync(dev)
    for calls in timed_calls if timers is not None else []:
        (v_ms, _), (d_ms, d_calls) = calls_ms(calls[0]), calls_ms(calls[1])
        rec.verify_ms.append(v_ms)
        rec.draft_ms.append(d_ms)
        rec.draft_calls.append(d_calls)
    rec.e2e_ms = (time.perf_counter() - t0) * 1e3
    rec.outputs = [list(r.output_ids) for r in reqs]
    if not rec.step_ms:
        rec.no_full_step_reason = why_no_full_step(rec, sched, len(prompts[0]), output_len, k)
    if k:
        steps = sum(r.spec_stats.verify_steps for r in reqs)
        rec.accepted_per_step = sum(r.spec_stats.accepted_drafts for r in reqs) / steps if steps else None
    return rec

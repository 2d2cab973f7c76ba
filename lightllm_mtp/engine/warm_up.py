"""A short synthetic workload run once before an engine takes traffic (the server's workers on CUDA), so that the
first users do not pay for compiling the Triton kernel variants of prompt chunks and prefix-cache hits.

Decode and verify steps are captured as CUDA graphs when the engine is built; prompt chunks run eagerly, and each
new Triton specialization (a batch of 1 or several prompts, lengths that are multiples of 16 or not, a chunk that
resumes from a snapshot or from a running request's state) compiles on first use, up to seconds per step.
Measured on an H100 at the 27B shape (benchmark/NOTES.md, stop 25): a multi-turn trace without this compiled
kernels for 6.6 s in the middle of serving. What it leaves: the prefix cache empty, its counters at zero, and no
acceptance history for adaptive speculation.
"""

from __future__ import annotations

import torch

from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.sampling_params import SamplingParams


SHORT_PROMPTS = (3, 6, 20)  # up to 64 query rows per KV head take the split-KV attention, a row tile per power of 2


def warm_up(engine: LLMEngine) -> None:
    """Round 1: three prompts at once (several prompts in a chunk, decode / verify rows beside prompt chunks, lengths
    off and on a multiple of 16, snapshots at prefill boundaries). Round 2: a resend of the first conversation with a
    new message (a hit that resumes from a snapshot), a branch inside it, and a one-token prompt, at once. Then short
    prompts one at a time. Then the prefix cache is emptied, its counters cleared, and adaptive speculation forgets
    the acceptance it saw."""
    cache = engine.prefix_cache
    interval = cache.interval if cache is not None else 256
    room = engine.max_model_len - 1
    steps = engine.runner.max_tokens_per_step
    new_tokens = 2 * steps + 2  # a few verify steps each, ending on the length limit
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size

    def tokens(n: int) -> list[int]:
        return torch.randint(0, vocab, (max(1, min(n, room - new_tokens)),), generator=gen).tolist()

    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)

    def add(prompts: list[list[int]]) -> list:  # cut to max_model_len; those the KV pool can hold at all
        cut = (p[: max(1, room - new_tokens)] for p in prompts)
        fits = [p for p in cut if engine.scheduler.kv_need(len(p), new_tokens) <= engine.scheduler.kv_capacity]
        return [engine.add_request(p, params) for p in fits]

    first = tokens(2 * interval + 3)
    round1 = add([first, tokens(17), tokens(interval)])
    _run(engine)
    answer = round1[0].output_ids if round1 and round1[0].prompt_ids == first else []
    add([first + answer + tokens(5), first[: interval + 1] + tokens(40), tokens(1)])
    _run(engine)
    for n in SHORT_PROMPTS:  # each alone: a step's longest chunk picks the attention kernel's row tile
        add([tokens(n)])
        _run(engine)
    if cache is not None:
        engine.evict_prefix_cache()
        cache.reset_stats()
    if engine.spec_controller is not None:  # adaptive k: forget the random prompts' acceptance
        engine.spec_controller.reset()


def _run(engine: LLMEngine) -> None:
    while engine.has_unfinished():
        engine.step()

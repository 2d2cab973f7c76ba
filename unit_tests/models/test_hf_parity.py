"""Logit parity with HF transformers' Qwen3.5 / Qwen3.5-MoE on the tiny checkpoints (fp32, CPU)."""

import dataclasses

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from unit_tests.hf_reference import hf_greedy, hf_greedy_chunked, hf_prefill_logits

ATOL = 1e-4
PROMPTS = [[5, 17, 300, 42, 9, 77, 1024, 3, 58, 600, 11], [900, 4, 4, 250], [31, 8, 222, 1500, 64, 2, 7]]
STEPS = 16


@pytest.fixture(params=["dense", "moe", "dense_tied"])
def model_dir(request, tiny_dense_dir, tiny_moe_dir, tiny_dense_tied_dir):
    return {"dense": tiny_dense_dir, "moe": tiny_moe_dir, "dense_tied": tiny_dense_tied_dir}[request.param]


def record_step_logits(llm):
    """Wraps the runner's sampler to keep, per request, the logits row it sampled from at each step."""
    seen: dict[int, list[torch.Tensor]] = {}
    sample = llm.engine.runner.sample

    def wrapped(logits, reqs):
        for row, req in zip(logits, reqs):
            seen.setdefault(req.request_id, []).append(row.clone())
        return sample(logits, reqs)

    llm.engine.runner.sample = wrapped
    return seen


def test_prefill_logits_match_hf_at_every_position(model_dir):
    llm = LLM(model_dir, dtype="float32", max_model_len=64)
    engine = llm.engine
    reqs = [engine.add_request(p, SamplingParams(temperature=0.0)) for p in PROMPTS]
    scheduled = engine.scheduler.schedule()
    assert [s.num_new_tokens for s in scheduled] == [len(p) for p in PROMPTS]
    batch, _ = engine.runner.build_batch(scheduled)
    batch = dataclasses.replace(batch, b_logits_index=torch.arange(batch.num_tokens))
    with torch.inference_mode():
        logits = engine.model.forward(batch).logits
    ours = logits.split([len(p) for p in PROMPTS])
    for prompt, got in zip(PROMPTS, ours):
        ref = hf_prefill_logits(model_dir, prompt)
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    for r in reqs:
        engine.abort(r)


def record_prompt_chunks(llm):
    """Wraps build_batch to keep each request's prompt chunk sizes."""
    chunks: dict[int, list[int]] = {}
    build = llm.engine.model_runner.build_batch

    def wrapped(scheduled, *args, **kwargs):
        for s in scheduled:
            if s.request.in_prefill:
                chunks.setdefault(s.request.request_id, []).append(s.num_new_tokens)
        return build(scheduled, *args, **kwargs)

    llm.engine.model_runner.build_batch = wrapped
    return chunks


@pytest.mark.parametrize("chunked_prefill_size", [4096, 3])
def test_greedy_decode_matches_hf_mixed_batch(model_dir, chunked_prefill_size):
    """A batch of mixed prompt lengths: 16 greedy steps, tokens and every step's logits equal HF's."""
    llm = LLM(model_dir, dtype="float32", max_model_len=64, chunked_prefill_size=chunked_prefill_size)
    seen = record_step_logits(llm)
    chunks = record_prompt_chunks(llm)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=STEPS, ignore_eos=True))
    for i, (prompt, out) in enumerate(zip(PROMPTS, outs)):
        if chunked_prefill_size < len(prompt):
            assert len(chunks[i]) > 1
            ref_tokens, ref_logits = hf_greedy_chunked(model_dir, prompt, STEPS, chunks[i])
        else:
            ref_tokens, ref_logits = hf_greedy(model_dir, prompt, STEPS)
        assert out.token_ids == ref_tokens, f"prompt {i}"
        assert out.finish_reason == "length"
        torch.testing.assert_close(torch.stack(seen[i]), ref_logits, atol=ATOL, rtol=0)


def test_chunked_prefill_gives_the_same_tokens(model_dir):
    params = SamplingParams(temperature=0.0, max_new_tokens=STEPS, ignore_eos=True)
    whole = LLM(model_dir, max_model_len=64).generate(PROMPTS, params)
    for size in (1, 2, 5):
        chunked = LLM(model_dir, max_model_len=64, chunked_prefill_size=size).generate(PROMPTS, params)
        assert [o.token_ids for o in chunked] == [o.token_ids for o in whole]


def test_all_slots_free_after_generate(tiny_dense_dir):
    llm = LLM(tiny_dense_dir, max_model_len=64, max_batch_size=2, chunked_prefill_size=4)
    pool, reqs = llm.engine.model.caches.kv_pool, llm.engine.model.caches.req_manager
    free_kv, free_req = pool.num_free, reqs.num_free
    params = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in (1, 5, 9, 2)]
    outs = llm.generate([[1, 2, 3], [4] * 7, [5, 6], [7] * 12], params)
    assert [len(o.token_ids) for o in outs] == [1, 5, 9, 2]
    llm.engine.evict_prefix_cache()
    assert pool.num_free == free_kv and reqs.num_free == free_req
    assert llm.engine.scheduler.reserved == 0 and not llm.engine.scheduler.running

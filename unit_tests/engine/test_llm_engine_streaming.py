"""LLMEngine as the server drives it: per-step token outputs, usage counters, and abort freeing every slot."""

import pytest

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.engine.request import FinishReason, RequestStatus
from lightllm_mtp.sampling_params import SamplingParams

PROMPTS = [[5, 17, 300, 42, 9, 77, 1024, 3, 58, 600, 11], [900, 4, 4, 250], [31, 8, 222, 1500, 64, 2, 7]]


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def engine(model_dir, **kwargs):
    return LLMEngine(EngineArgs(model_dir=str(model_dir), max_model_len=64, max_batch_size=4, **kwargs))


def assert_idle(e):
    u = e.usage()
    assert (u.kv_used, u.kv_reserved, u.req_slots_used, u.running, u.waiting) == (0, 0, 0, 0, 0)
    # the KV part of the default budget: 4 requests of 64 tokens and their lookahead slots
    assert u.kv_capacity == e.cache_budget.kv_tokens <= 4 * (64 + e.scheduler.lookahead_slots)
    assert u.req_slots_capacity == 4


@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "mtp"])
def test_step_outputs_stream_every_token_once(tiny_dense_dir, mtp):
    e = engine(tiny_dense_dir, chunked_prefill_size=6, **mtp)
    reqs = [e.add_request(p, greedy(n)) for p, n in zip(PROMPTS, [9, 5, 7])]
    streamed = {r.request_id: [] for r in reqs}
    finished = []
    while e.has_unfinished():
        for o in e.step_outputs():
            assert o.new_token_ids and o.request.request_id not in finished
            streamed[o.request.request_id] += o.new_token_ids
            if o.finished:
                finished.append(o.request.request_id)
    assert sorted(finished) == [r.request_id for r in reqs]
    assert [streamed[r.request_id] for r in reqs] == [r.output_ids for r in reqs]
    assert [len(r.output_ids) for r in reqs] == [9, 5, 7]
    assert_idle(e)


def test_abort_frees_slots_in_every_state(tiny_dense_dir):
    """Waiting, mid-prompt (chunked) and generating MTP requests (with a pending draft block) all free at once."""
    e = engine(tiny_dense_dir, chunked_prefill_size=12, mtp_mode="eagle_with_att", mtp_step=2, disable_overlap=True,
               prefix_cache_state_share=0.1)  # KV for the three requests below (the auto share would halve it)
    gen = e.add_request(PROMPTS[1], greedy(30))
    e.step()  # gen prefilled, its first draft block allocated
    assert gen.blocks and all(b.numel() == 3 for b in gen.blocks)  # one more when the next step is queued
    short = e.add_request(PROMPTS[2], greedy(30))
    long = e.add_request(PROMPTS[0] * 3, greedy(30))  # 33 tokens: several chunks
    queued = [e.add_request(PROMPTS[2], greedy(30)) for _ in range(2)]
    e.step()  # budget 12: gen's verify block (3), short's prompt (7), 2 tokens of long; the rest wait
    assert long.in_prefill and long.kv_slots and gen.blocks and short.blocks
    u = e.usage()
    assert (u.waiting, u.running, u.req_slots_used) == (2, 3, 3) and u.kv_used > 0 and u.kv_reserved > 0
    for r in [queued[-1], long, gen, short, queued[0]]:
        e.abort(r)
        assert r.finish_reason is FinishReason.ABORT and r.status is RequestStatus.FINISHED
        assert r.req_idx is None and not r.blocks and not r.kv_slots
    assert not e.has_unfinished()
    assert_idle(e)
    # the engine keeps serving after the aborts
    r = e.add_request(PROMPTS[2], greedy(4))
    while e.has_unfinished():
        e.step()
    assert len(r.output_ids) == 4
    assert_idle(e)

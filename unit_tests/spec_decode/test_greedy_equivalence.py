"""Greedy MTP output must equal plain decoding token for token."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from unit_tests.spec_decode.oracle_drafts import oracle_drafts

PROMPTS = [[5, 17, 300, 42, 9, 77, 1024, 3, 58, 600, 11, 12, 13], [900, 4, 4, 250], [31, 8, 222, 1500, 64, 2, 7]]
MAX_NEW = [23, 9, 16]  # requests finish at different steps, mid-block for most k


def mtp_kwargs(mode, step):
    if mode == "ptd":
        return dict(mtp_mode="eagle_with_att", mtp_step=step, parallel_drafting=True)
    return dict(mtp_mode=mode, mtp_step=step)


def greedy(n, stops=()):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True, stop_token_ids=list(stops))


@pytest.fixture(params=["dense", "moe"])
def model_dir(request, tiny_dense_mtp3_dir, tiny_moe_mtp3_dir):
    return {"dense": tiny_dense_mtp3_dir, "moe": tiny_moe_mtp3_dir}[request.param]


@pytest.fixture
def reference(model_dir):
    llm = LLM(model_dir, max_model_len=64)
    return [o.token_ids for o in llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])]


@pytest.mark.parametrize("mode", ["eagle_with_att", "vanilla_with_att"])
@pytest.mark.parametrize("step", [1, 2, 3])
def test_mtp_greedy_equals_plain_decoding(model_dir, reference, mode, step):
    llm = LLM(model_dir, max_model_len=64, mtp_mode=mode, mtp_step=step, chunked_prefill_size=5)
    outs = llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    assert [o.token_ids for o in outs] == reference
    assert all(o.spec.verify_steps > 0 for o in outs)


@pytest.mark.parametrize("step", [1, 2, 4, 7])
def test_parallel_drafting_greedy_equals_plain_decoding(model_dir, reference, step):
    llm = LLM(model_dir, max_model_len=64, mtp_mode="eagle_with_att", mtp_step=step, parallel_drafting=True,
              chunked_prefill_size=5)  # fmt: skip
    outs = llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    assert [o.token_ids for o in outs] == reference
    assert all(o.spec.verify_steps > 0 for o in outs)
    assert all(len(o.spec.proposed_at) == step for o in outs)


@pytest.mark.parametrize("mode", ["eagle_with_att", "vanilla_with_att", "ptd"])
@pytest.mark.parametrize("step", [1, 3])
@pytest.mark.parametrize("corrupt_every", [1000, 3])
def test_high_acceptance_blocks_stay_exact(monkeypatch, model_dir, reference, mode, step, corrupt_every):
    oracle_drafts(monkeypatch, reference, corrupt_every)
    llm = LLM(model_dir, max_model_len=64, **mtp_kwargs(mode, step))
    pool, reqs = llm.engine.model.caches.kv_pool, llm.engine.model.caches.req_manager
    free_kv, free_req = pool.num_free, reqs.num_free
    outs = llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    assert [o.token_ids for o in outs] == reference
    accepted = sum(o.spec.accepted_drafts_per_step * o.spec.verify_steps for o in outs)
    assert accepted > 0
    if corrupt_every == 1000 and step > 1:
        assert min(o.spec.tokens_per_step for o in outs) > 1.5
    llm.engine.evict_prefix_cache()
    assert pool.num_free == free_kv and reqs.num_free == free_req


def test_stop_token_inside_an_accepted_block(monkeypatch, tiny_dense_mtp3_dir):
    plain = LLM(tiny_dense_mtp3_dir, max_model_len=64)
    ref = plain.generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    reference = [o.token_ids for o in ref]
    stop = reference[0][7]
    expect = plain.generate(PROMPTS[:1], greedy(MAX_NEW[0], [stop]))[0].token_ids
    assert expect == reference[0][: reference[0].index(stop) + 1]
    oracle_drafts(monkeypatch, reference, corrupt_every=1000)
    llm = LLM(tiny_dense_mtp3_dir, max_model_len=64, mtp_mode="eagle_with_att", mtp_step=3)
    out = llm.generate(PROMPTS[:1], greedy(MAX_NEW[0], [stop]))[0]
    assert out.token_ids == expect and out.finish_reason == "stop"
    llm.engine.evict_prefix_cache()
    assert llm.engine.model.caches.kv_pool.num_free == llm.engine.model.caches.kv_pool.size


def test_drafts_capped_near_max_model_len(model_dir):
    prompts = [[3] * 20, [4] * 22, [5] * 23]
    plain = LLM(model_dir, max_model_len=24)
    ref = [o.token_ids for o in plain.generate(prompts, greedy(100))]
    for mode in ("eagle_with_att", "vanilla_with_att", "ptd"):
        llm = LLM(model_dir, max_model_len=24, **mtp_kwargs(mode, 3))
        outs = llm.generate(prompts, greedy(100))
        assert [o.token_ids for o in outs] == ref
        assert [len(o.token_ids) for o in outs] == [4, 2, 1]
        assert all(o.finish_reason == "length" for o in outs)


def test_blocks_stay_full_near_max_new_tokens(monkeypatch, tiny_dense_mtp3_dir):
    """Requests finishing at different steps keep k drafts to the end (uniform verify batches, the CUDA-graph
    layout) and still emit exactly max_new_tokens, equal to plain decoding."""
    from lightllm_mtp.spec_decode.step_builder import StepBuilder

    drafts_per_block = []
    real = StepBuilder.verify_batch

    def recording(self, b_req_idx, rows=None):
        drafts_per_block.append(self.state.num_drafts[b_req_idx.long()].tolist())
        return real(self, b_req_idx, rows)

    monkeypatch.setattr(StepBuilder, "verify_batch", recording)
    plain = LLM(tiny_dense_mtp3_dir, max_model_len=64).generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    llm = LLM(tiny_dense_mtp3_dir, max_model_len=64, mtp_mode="eagle_with_att", mtp_step=3)
    outs = llm.generate(PROMPTS, [greedy(n) for n in MAX_NEW])
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert [len(o.token_ids) for o in outs] == MAX_NEW
    assert drafts_per_block and all(n == 3 for sizes in drafts_per_block for n in sizes)

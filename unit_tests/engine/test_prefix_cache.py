"""Prefix cache: greedy output and MTP acceptance identical with and without it, snapshots equal to a from-scratch
GDN state, and every KV / state / snapshot slot accounted for after each workload."""

import pytest
import torch

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.common.radix_cache import key_elements
from lightllm_mtp.engine.llm_engine import LLMEngine
from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.engine.cache_budget import MIN_SNAPSHOTS

INTERVAL = 8  # snapshot interval of these tests
SYSTEM = [(37 * i) % 700 + 3 for i in range(21)]  # a shared "system prompt"
NEW = 5
MODES = {
    "plain": {},
    "eagle": dict(mtp_mode="eagle_with_att", mtp_step=2),
    "vanilla": dict(mtp_mode="vanilla_with_att", mtp_step=3),
    "ptd": dict(mtp_mode="eagle_with_att", mtp_step=2, parallel_drafting=True),
}


def greedy(n=NEW):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def build(model_dir, cache, **kw):
    kw.setdefault("max_model_len", 96)
    kw.setdefault("chunked_prefill_size", 16)
    kw.setdefault("max_total_token_num", 4 * 8 * 96)  # one budget: a quarter KV (8 x 96 slots), the rest ~70 snapshots
    kw.setdefault("prefix_cache_state_share", 0.75)
    return LLM(model_dir, prefix_cache=cache, prefix_cache_interval=INTERVAL, **kw)


def check_accounting(llm):
    """Nothing running: every KV slot is free or the tree's, every request / state slot free; evicting the tree
    returns the pools to empty."""
    engine = llm.engine
    caches = engine.model.caches
    u = engine.usage()
    assert (u.kv_used, u.kv_reserved, u.req_slots_used, u.running, u.waiting) == (0, 0, 0, 0, 0)
    cache = engine.prefix_cache
    if cache is not None:
        cache.tree.check()
        assert cache.tree.num_locked == 0
        assert caches.kv_pool.num_free + cache.tree.num_tokens == caches.kv_pool.size
        assert all(n.snapshot is None or n.snapshot.pins == 0 for n in cache.tree._nodes())
    engine.evict_prefix_cache()
    assert caches.kv_pool.num_free == caches.kv_pool.size
    if cache is not None:
        assert cache.tree.num_tokens == 0 and cache.tree.snapshot_allocator.num_free == cache.snapshots.size


def rounds(first_output):
    """Prompt batches, each one `generate` call: a cold request; two concurrent requests on the system prompt; a
    branch at every offset of a snapshot interval; a multi-turn resend of the first chat with 0..3 new tokens."""
    q1 = SYSTEM + [11, 12, 13, 14]
    turn = q1 + first_output
    return [
        [q1],
        [SYSTEM + [21, 22, 23], SYSTEM + [31, 32, 33, 34, 35, 36]],
        [SYSTEM[: 2 * INTERVAL + j] + [600 + j, 601, 602] for j in range(INTERVAL)],
        [turn + [40 + i for i in range(j)] for j in range(4)],
    ]


def run(llm, batches):
    outs = []
    for prompts in batches:
        outs += llm.generate(prompts, greedy())
    return outs


@pytest.fixture(params=["dense", "moe"])
def model_dir(request, tiny_dense_mtp3_dir, tiny_moe_mtp3_dir):
    return {"dense": tiny_dense_mtp3_dir, "moe": tiny_moe_mtp3_dir}[request.param]


@pytest.mark.parametrize("mode", list(MODES))
def test_outputs_and_acceptance_identical_with_the_cache(model_dir, mode):
    ref_llm = build(model_dir, False, **MODES[mode])
    first = ref_llm.generate([SYSTEM + [11, 12, 13, 14]], greedy())[0].token_ids
    batches = rounds(first)
    ref = run(ref_llm, batches)
    llm = build(model_dir, True, **MODES[mode])
    outs = run(llm, batches)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert [o.spec for o in outs] == [o.spec for o in ref]  # drafts and acceptance per position, per request
    cached = [o.num_cached_tokens for o in outs]
    lookahead = llm.engine.prefix_cache.lookahead
    assert cached[0] == 0 and min(cached[1:3]) >= 2 * INTERVAL
    assert all(c > 0 for c in cached[3:])
    assert all(len(o.prompt_token_ids) - c >= max(1, lookahead) for o, c in zip(outs, cached))
    if mode == "vanilla":  # the tree's end lags the committed state by modules - 1 rows: the last verifies of this
        # random model keep no state there (see test_multi_layer_mtp_end_snapshot_from_its_last_verify)
        assert min(cached[-4:]) == len(batches[0][0])  # the resend resumes at the first chat's prompt end
    else:  # the resend resumes at the first chat's end: exactly 1..4 uncached tokens (1..k+2 under MTP k=2)
        assert [len(o.prompt_token_ids) - c for o, c in zip(outs[-4:], cached[-4:])] == [1, 2, 3, 4]
    check_accounting(llm)


@pytest.mark.parametrize("mode", ["plain", "eagle"])
def test_small_pool_forces_evictions(tiny_dense_mtp3_dir, mode):
    """A pool for about one request at a time: admission waits for locked slots, every allocation evicts."""
    batches = [[SYSTEM + [50 + i, 51, 52 + i] for i in range(6)], [SYSTEM[:9] + [70, 71]] * 2]
    ref = run(build(tiny_dense_mtp3_dir, False, max_batch_size=2, **MODES[mode]), batches)
    llm = build(tiny_dense_mtp3_dir, True, max_batch_size=2, max_model_len=48, max_total_token_num=480,
                prefix_cache_state_share=0.9, **MODES[mode])  # fmt: skip
    assert llm.engine.model.caches.kv_pool.size == 48 + llm.engine.scheduler.lookahead_slots  # one request fits
    tree, evicted = llm.engine.prefix_cache.tree, []
    evict = tree.evict  # RadixCache.alloc_kv evicts what an allocation misses
    tree.evict = lambda n: evicted.append(evict(n)) or evicted[-1]
    outs = run(llm, batches)
    assert len(evicted) >= 4 and sum(evicted) > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    check_accounting(llm)


def test_abort_mid_prefill_of_a_request_on_cached_slots(tiny_dense_mtp3_dir):
    args = EngineArgs(tiny_dense_mtp3_dir, max_model_len=96, chunked_prefill_size=4, prefix_cache_interval=INTERVAL,
                      prefix_cache_state_share=0.5, mtp_mode="eagle_with_att", mtp_step=2)  # fmt: skip
    engine = LLMEngine(args)
    plain = build(tiny_dense_mtp3_dir, False)
    first = engine.add_request(SYSTEM + [1, 2], greedy())
    while engine.has_unfinished():
        engine.step()
    victim = engine.add_request(SYSTEM + list(range(100, 120)), greedy())
    engine.step()
    engine.step()
    assert victim.num_cached_tokens > 0 and victim.in_prefill
    engine.abort(victim)
    after = engine.add_request(SYSTEM + list(range(100, 110)), greedy())
    while engine.has_unfinished():
        engine.step()
    want = plain.generate([SYSTEM + [1, 2], SYSTEM + list(range(100, 110))], greedy())
    assert [first.output_ids, after.output_ids] == [o.token_ids for o in want]
    assert after.num_cached_tokens >= 2 * INTERVAL
    llm = type("L", (), {"engine": engine})()
    check_accounting(llm)


def test_snapshots_equal_the_from_scratch_state(tiny_dense_mtp3_dir):
    prompt = [(13 * i) % 500 + 7 for i in range(27)]
    llm = build(tiny_dense_mtp3_dir, True)
    llm.generate([prompt], greedy(2))
    cache, state = llm.engine.prefix_cache, llm.engine.model.caches.req_manager.linear_state
    k1 = state.conv_cols
    for b in (8, 16, 24, 27):
        node = cache.tree.match(key_elements(prompt, b, 0))[-1]
        assert node.depth == b and node.snapshot is not None
        scratch = LLMEngine(EngineArgs(tiny_dense_mtp3_dir, max_model_len=96, prefix_cache=False, disable_overlap=True))
        req = scratch.add_request(prompt[:b], greedy(2))
        scratch.step()  # the prompt and its first token: the state covers the prompt exactly
        live = scratch.model.caches.req_manager.linear_state
        slot = node.snapshot.slot
        torch.testing.assert_close(cache.snapshots.conv[:, slot], live.conv[:, req.req_idx, :, :k1], rtol=0, atol=1e-6)
        torch.testing.assert_close(cache.snapshots.ssm[:, slot], live.ssm[:, req.req_idx], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overlap", [True, False])
def test_request_ending_on_a_stop_token_leaves_its_end(tiny_dense_mtp3_dir, overlap):
    """Eagle MTP: a chat that stops on a stop token is cached up to its end, also when its next verify was already
    queued (overlap): that verify's first row is snapshotted and joins the tree keyed by the token it emitted."""
    prompt = SYSTEM + [5, 6]
    mtp = dict(MODES["eagle"], disable_overlap=not overlap)
    full = build(tiny_dense_mtp3_dir, False, **mtp).generate([prompt], greedy(12))[0].token_ids
    i = next(j for j in range(3, 10) if full[j] not in full[:j])
    stop = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=[full[i]])
    resend = prompt + full[: i + 3] + [777]
    ref = build(tiny_dense_mtp3_dir, False, **mtp).generate([resend], greedy())[0]
    llm = build(tiny_dense_mtp3_dir, True, **mtp)
    first = llm.generate([prompt], stop)[0]
    assert first.token_ids == full[: i + 1] and first.finish_reason == "stop"
    out = llm.generate([resend], greedy())[0]
    assert out.token_ids == ref.token_ids and out.spec == ref.spec
    assert out.num_cached_tokens == len(prompt) + i + overlap  # up to the stop token, or past it (overlap)
    check_accounting(llm)


def test_length_capped_answer_is_cached_to_its_end_under_overlap(trained_dense_dir):
    """Eagle MTP with overlap: an answer that ends by max_new_tokens leaves the tree its end (the queued step never
    holds a request the step being read may end), so a resend of prompt + answer + a new turn recomputes only the new
    turn and the draft lookahead, whatever the length the answer ended at. (A trained checkpoint: its steps bring
    several tokens, so a step may end a request without certainly ending it.)"""
    llm = build(trained_dense_dir, True, **MODES["eagle"])
    lookahead = 1
    for n in range(3, 12):
        prompt = SYSTEM + [n, 900 + n]
        answer = llm.generate([prompt], greedy(n))[0].token_ids
        out = llm.generate([prompt + answer + [11, 12]], greedy(2))[0]
        assert len(prompt) + n + 2 - out.num_cached_tokens == 2 + lookahead, n
    check_accounting(llm)


def test_budget_cut_chunks_end_on_snapshot_boundaries(tiny_dense_mtp3_dir):
    llm = build(tiny_dense_mtp3_dir, True, chunked_prefill_size=20)
    chunks, schedule = [], llm.engine.scheduler.schedule

    def recording(**kw):
        out = schedule(**kw)
        chunks.extend(s.num_new_tokens for s in out if s.request.in_prefill)
        return out

    llm.engine.scheduler.schedule = recording
    llm.generate([list(range(3, 48))], greedy(1))
    assert chunks == [16, 16, 13]  # budget 20, interval 8: cut back to 16 and 32, then the prompt's end
    node = llm.engine.prefix_cache.tree.match(key_elements(list(range(3, 48)), 44, 0))
    assert [n.depth for n in node if n.snapshot is not None] == [8, 16, 24, 32, 40]


@pytest.mark.parametrize("mode", ["plain", "eagle"])
def test_seeded_sampling_identical_with_the_cache(tiny_dense_mtp3_dir, mode):
    """A resumed request samples from the same distributions with the same generator: identical tokens."""
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=8, seed=11, ignore_eos=True)
    batches = [[SYSTEM + [1, 2]], [SYSTEM + [3, 4, 5], SYSTEM[:18] + [6]]]

    def run_all(cache):
        llm = build(tiny_dense_mtp3_dir, cache, **MODES[mode])
        return [o.token_ids for b in batches for o in llm.generate(b, params)], llm

    ref, _ = run_all(False)
    outs, llm = run_all(True)
    assert outs == ref and llm.engine.prefix_cache_stats().hits == 2
    check_accounting(llm)


def test_few_snapshot_slots_go_to_the_deepest_boundaries(tiny_dense_mtp3_dir):
    llm = LLM(tiny_dense_mtp3_dir, max_model_len=96, chunked_prefill_size=64, prefix_cache_interval=INTERVAL,
              prefix_cache_state_share=0.001)  # fmt: skip
    cache = llm.engine.prefix_cache
    assert cache.snapshots.size == MIN_SNAPSHOTS == 4  # the floor
    prompt = list(range(3, 48))
    llm.generate([prompt], greedy(1))
    assert sorted(n.depth for n in cache.tree._nodes() if n.snapshot is not None) == [24, 32, 40, 45]
    out = llm.generate([prompt[:44] + [5, 6]], greedy())[0]
    assert out.num_cached_tokens == 40
    check_accounting(llm)


def test_multi_layer_mtp_end_snapshot_from_its_last_verify():
    """Multi-layer MTP (3 modules): the tree's end lags the committed state by 2 positions; when the last verify
    accepted enough rows its SSM row / conv window there is the end snapshot: equal to a from-scratch prefill's
    state, and a resend resumes at it with the output it has without the cache."""
    from unit_tests.trained_fixtures import MTP3_PTD

    model_dir = MTP3_PTD  # trained: its drafts get accepted
    mtp = dict(mtp_mode="vanilla_with_att", mtp_step=3)
    llm = LLM(model_dir, max_model_len=128, prefix_cache_interval=INTERVAL, max_total_token_num=4096,
              prefix_cache_state_share=0.75, disable_overlap=True, **mtp)  # fmt: skip
    prompt = [(13 * i) % 500 + 7 for i in range(21)]
    out = llm.generate([prompt], greedy(10))[0]  # its last verify commits 4 rows, 1 past the output
    tokens = prompt + out.token_ids
    depth = len(tokens) - 3
    cache, state = llm.engine.prefix_cache, llm.engine.model.caches.req_manager.linear_state
    node = cache.tree.match(key_elements(tokens, depth, 3))[-1]
    assert node.depth == depth > len(prompt) and node.snapshot is not None
    scratch = LLMEngine(EngineArgs(model_dir, max_model_len=128, prefix_cache=False, disable_overlap=True))
    req = scratch.add_request(tokens[:depth], greedy(2))
    scratch.step()
    live, slot, k1 = scratch.model.caches.req_manager.linear_state, node.snapshot.slot, state.conv_cols
    # verify rows vs a prefill: the same arithmetic up to fp32 rounding of differently shaped GEMMs
    torch.testing.assert_close(cache.snapshots.conv[:, slot], live.conv[:, req.req_idx, :, :k1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.snapshots.ssm[:, slot], live.ssm[:, req.req_idx], rtol=1e-5, atol=1e-5)
    resend = tokens + [5, 6]
    got = llm.generate([resend], greedy(6))[0]
    want = LLM(model_dir, max_model_len=128, prefix_cache=False, **mtp).generate([resend], greedy(6))[0]
    assert got.num_cached_tokens == depth and got.token_ids == want.token_ids
    check_accounting(llm)


@pytest.mark.parametrize("mode", ["plain", "eagle"])
def test_cache_salt_partitions_the_cache(tiny_dense_dir, mode):
    """Issue 35 item 8: a request reuses cached prefixes only of requests with the same cache_salt, so
    `num_cached_tokens` tells a client nothing about other salts' prompts; the output is the same either way."""
    llm = build(tiny_dense_dir, True, **MODES[mode])
    prompt = SYSTEM + [11, 12, 13, 14]

    def run(salt):
        params = SamplingParams(temperature=0.0, max_new_tokens=NEW, ignore_eos=True, cache_salt=salt)
        out = llm.generate([prompt], params)[0]
        return out.token_ids, out.num_cached_tokens

    first, cached = run("tenant-a")
    assert cached == 0
    again, hit = run("tenant-a")  # the same salt hits
    assert again == first and hit >= 2 * INTERVAL
    assert run("tenant-b") == (first, 0)  # another salt: nothing
    assert run(None) == (first, 0)  # no salt is a partition of its own
    assert run(None) == (first, hit) and run("tenant-b") == (first, hit)
    check_accounting(llm)

"""Memory at long context: a request longer than the KV pool (prompt + max_new_tokens + lookahead) is refused when it
is added, never failing mid-run; one request owning the whole pool runs to its end under the prefix cache and MTP,
its prompt's many snapshot boundaries sharing the few snapshot slots (the deepest kept), and the requests after it
evict what it left and give the uncached tokens."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.engine.cache_budget import MIN_SNAPSHOTS
from unit_tests.engine.test_prefix_cache import check_accounting
from unit_tests.rope_fixtures import ORIGINAL_WINDOW, YARN_FACTOR

WINDOW = YARN_FACTOR * ORIGINAL_WINDOW  # 256: a "long" request of the tiny YaRN model
INTERVAL = 16
EAGLE = dict(mtp_mode="eagle_with_att", mtp_step=2)
LOOKAHEAD = 3 * (2 + 1)  # engine/step.kv_lookahead_slots(2)


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def prompt(seed, n):
    return [(seed * 31 + 7 * i) % 1500 + 3 for i in range(n)]


def test_a_request_longer_than_the_pool_is_refused_when_added(tiny_yarn_dir):
    llm = LLM(tiny_yarn_dir, max_model_len=WINDOW, max_total_token_num=WINDOW, **EAGLE)
    engine = llm.engine
    assert engine.scheduler.lookahead_slots == LOOKAHEAD
    too_long = WINDOW - LOOKAHEAD - 200 + 1  # prompt 200 + this many + the lookahead: one slot more than the pool
    with pytest.raises(ValueError, match=rf"needs {WINDOW + 1} KV slots .*lookahead slots\); the pool has {WINDOW}: "
                                         "lower max_new_tokens"):  # fmt: skip
        llm.generate([prompt(1, 200)], greedy(too_long))
    assert not engine.has_unfinished() and engine.usage().kv_used == 0  # nothing was admitted
    out = llm.generate([prompt(1, 200)], greedy(too_long - 1))[0]  # exactly the pool: runs to its end
    assert len(out.token_ids) == too_long - 1 and out.finish_reason == "length"
    check_accounting(llm)


@pytest.mark.parametrize("mode", ["plain", "eagle"])
def test_one_request_owning_the_pool_under_the_prefix_cache(tiny_yarn_dir, mode):
    kwargs = EAGLE if mode == "eagle" else {}
    lookahead = LOOKAHEAD if mode == "eagle" else 1
    first, second = prompt(1, 230), prompt(2, 230)
    resend = first + [5, 6, 7]
    requests = [(first, 20), (second, 20), (resend, 10)]
    ref = LLM(tiny_yarn_dir, max_model_len=WINDOW, prefix_cache=False, **kwargs)
    expected = [ref.generate([p], greedy(n))[0].token_ids for p, n in requests]
    llm = LLM(tiny_yarn_dir, max_model_len=WINDOW, max_total_token_num=WINDOW + lookahead, max_batch_size=1,
              prefix_cache_interval=INTERVAL, prefix_cache_state_share=0.5, chunked_prefill_size=64,
              **kwargs)  # fmt: skip
    engine, tree = llm.engine, llm.engine.prefix_cache.tree
    assert engine.model.caches.kv_pool.size == WINDOW + lookahead  # the KV pool holds exactly one long request
    assert engine.cache_budget.num_snapshots == MIN_SNAPSHOTS  # its 14 prompt boundaries share 4 snapshot slots
    out = llm.generate([first], greedy(20))[0]
    assert out.token_ids == expected[0]
    depths = sorted(n.depth for n in tree._nodes() if n.snapshot is not None)
    assert len(depths) == MIN_SNAPSHOTS and min(depths) >= 230 - MIN_SNAPSHOTS * INTERVAL - 1  # the deepest kept
    check_accounting_without_evicting(llm)
    out = llm.generate([second], greedy(20))[0]  # evicts the first request's KV as it allocates
    assert out.token_ids == expected[1] and out.num_cached_tokens == 0
    out = llm.generate([resend], greedy(10))[0]
    assert out.token_ids == expected[2]
    check_accounting(llm)


def check_accounting_without_evicting(llm):
    engine, tree = llm.engine, llm.engine.prefix_cache.tree
    tree.check()
    assert tree.num_locked == 0 and engine.usage().kv_used == 0
    assert engine.model.caches.kv_pool.num_free + tree.num_tokens == engine.model.caches.kv_pool.size

"""The start-up warm-up (engine/warm_up.py): it runs prompt batches and a prefix-cache hit, then leaves the engine as
it found it: pools empty, cache counters at zero, and the same greedy tokens afterwards."""

import pytest

from lightllm_mtp import SamplingParams
from lightllm_mtp.engine.prefix_cache import PrefixCache
from lightllm_mtp.engine.warm_up import SHORT_PROMPTS, warm_up

from unit_tests.engine.test_prefix_cache import build, check_accounting

PROMPTS = [[(13 * i + j) % 500 + 2 for i in range(30 + 7 * j)] for j in range(3)]


@pytest.mark.parametrize("mode", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)])
def test_warm_up_hits_the_cache_then_leaves_no_trace(tiny_dense_mtp3_dir, mode, monkeypatch):
    params = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    expected = [o.token_ids for o in build(tiny_dense_mtp3_dir, True, **mode).generate(PROMPTS, params)]
    llm = build(tiny_dense_mtp3_dir, True, **mode)
    seen = []
    reset = PrefixCache.reset_stats
    monkeypatch.setattr(PrefixCache, "reset_stats", lambda self: (seen.append(self.stats()), reset(self)))
    warm_up(llm.engine)
    (before_reset,) = seen
    assert before_reset.hits >= 2 and before_reset.cached_tokens > 0  # the resend and the branch resumed
    assert before_reset.queries == 6 + len(SHORT_PROMPTS)
    stats = llm.engine.prefix_cache_stats()
    assert (stats.queries, stats.hits, stats.cached_tokens, stats.tree_tokens, stats.snapshots) == (0, 0, 0, 0, 0)
    check_accounting(llm)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected


def test_warm_up_without_the_cache_and_with_a_tiny_pool(tiny_dense_mtp3_dir):
    llm = build(tiny_dense_mtp3_dir, False, max_model_len=40, max_total_token_num=48)
    warm_up(llm.engine)  # the long warm-up prompts do not fit this pool and are left out
    check_accounting(llm)


def test_warm_up_leaves_adaptive_speculation_without_history(tiny_dense_mtp3_dir):
    llm = build(tiny_dense_mtp3_dir, True, mtp_mode="eagle_with_att", mtp_step=2, mtp_adaptive=True)
    controller = llm.engine.spec_controller
    fresh = controller.prior()
    warm_up(llm.engine)
    assert controller.prior() == fresh and controller._launches == 0

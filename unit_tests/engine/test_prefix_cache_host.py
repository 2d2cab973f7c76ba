"""Host offload of evicted GDN snapshots (--prefix_cache_host_gb): with 4 device snapshots every admission evicts,
offloaded snapshots come back on hits; greedy output equals the output without the cache; every device and host
slot is free or the tree's, and evicting the tree empties both tiers."""

import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.common.state_snapshots import StateSnapshotPool

SYSTEM = [(37 * i) % 700 + 3 for i in range(21)]
PROMPTS = [SYSTEM[: 8 + (i % 3) * 4] + [100 + i, 200 + j] for i in range(6) for j in range(2)]


def run(llm):
    params = SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True)
    return [llm.generate([p], params)[0] for _ in range(2) for p in PROMPTS]


@pytest.mark.parametrize("host_slots", [2, 40])
@pytest.mark.parametrize("mtp", [{}, dict(mtp_mode="eagle_with_att", mtp_step=2)], ids=["plain", "eagle"])
def test_offloaded_snapshots_come_back_exactly(tiny_dense_mtp3_dir, mtp, host_slots):
    kw = dict(max_model_len=96, chunked_prefill_size=16, prefix_cache_interval=4, **mtp)
    ref = run(LLM(tiny_dense_mtp3_dir, prefix_cache=False, **kw))
    llm = LLM(tiny_dense_mtp3_dir, prefix_cache_state_share=0.001, **kw)  # 4 device snapshots
    per = StateSnapshotPool.bytes_per_snapshot(llm.engine.model.caches.req_manager.linear_state)
    llm = LLM(tiny_dense_mtp3_dir, prefix_cache_state_share=0.001, prefix_cache_host_gb=host_slots * per / 2**30, **kw)
    cache = llm.engine.prefix_cache
    assert cache.snapshots.size == 4 and cache.tree.host.allocator.size == host_slots
    outs = run(llm)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    stats = llm.engine.prefix_cache_stats()
    assert 0 < stats.host_snapshots == cache.tree.num_host_snapshots <= host_slots
    if host_slots == 40:  # room for every offloaded snapshot: the second round finds them
        assert stats.host_fetches > 0 and stats.hits > 20
    tree, kv = cache.tree, llm.engine.model.caches.kv_pool
    tree.check()
    assert tree.num_locked == 0 and kv.num_free + tree.num_tokens == kv.size
    llm.engine.evict_prefix_cache()
    assert kv.num_free == kv.size and tree.snapshot_allocator.num_free == 4
    assert tree.host.allocator.num_free == host_slots


def test_negative_host_memory_is_rejected(tiny_dense_mtp3_dir):
    with pytest.raises(ValueError, match="prefix_cache_host_gb"):
        LLM(tiny_dense_mtp3_dir, max_model_len=64, prefix_cache_host_gb=-1.0)

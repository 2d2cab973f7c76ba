"""One budget for KV slots and GDN snapshots: the split follows prefix_cache_state_share with a floor, the sizes are
the pools' real bytes, and the whole budget comes back when the tree is evicted."""

import torch

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.common.state_snapshots import StateSnapshotPool
from lightllm_mtp.engine.cache_budget import AUTO_SHARE_RANGE, MIN_SNAPSHOTS, auto_state_share, split_budget


def test_split_follows_the_share_with_a_floor():
    b = split_budget(1000, 100, 1000, 0.5)  # 100 kB: 50 snapshots, 500 slots
    assert (b.kv_tokens, b.num_snapshots, b.total_bytes) == (500, 50, 100_000)
    assert split_budget(1000, 100, 1000, None).num_snapshots == 0
    one_request = split_budget(1000, 100, 1000, 0.5, min_kv_tokens=800)  # KV keeps one max-length request
    assert (one_request.kv_tokens, one_request.num_snapshots) == (800, 20)
    assert split_budget(600, 100, 1000, 0.5, min_kv_tokens=800).kv_tokens == 600  # the budget is below one request
    small = split_budget(1000, 100, 1000, 0.001)  # KV keeps its part; the snapshot floor comes on top
    assert (small.num_snapshots, small.kv_tokens) == (MIN_SNAPSHOTS, 999)


def test_auto_share_holds_snapshots_per_request_slot_within_its_range():
    lo, hi = AUTO_SHARE_RANGE
    assert auto_state_share(100_000, 1000, 4) == 16 * 1000 / 100_000  # 4 slots x 4 snapshots of 1 kB
    assert auto_state_share(1_000_000, 1000, 4) == lo  # 1.6%: raised to the floor
    assert auto_state_share(100_000, 1000, 64) == hi  # 256 kB wanted of 100 kB: capped
    # the 27B shape behind a 16-slot server (8192-token requests): 0.1 gave 5 snapshots of 147 MiB, auto 29
    kv_per_token, snap = 69632, 153_944_064  # cache_budget.kv_bytes_per_token (one MTP layer), snapshot_bytes
    budget = split_budget(16 * 8192, kv_per_token, snap, auto_state_share(16 * 8192 * kv_per_token, snap, 16))
    assert budget.num_snapshots == 29 and budget.kv_tokens == 16 * 8192 // 2


def test_pools_hold_the_budget_and_evicting_returns_it(tiny_dense_mtp3_dir):
    llm = LLM(tiny_dense_mtp3_dir, max_model_len=64, max_total_token_num=600, prefix_cache_interval=8,
              prefix_cache_state_share=0.5, mtp_mode="eagle_with_att", mtp_step=2)  # fmt: skip
    engine = llm.engine
    caches, budget = engine.model.caches, engine.cache_budget
    kv = caches.kv_pool
    kv_bytes = kv.k_buffer[:, 0].numel() * 2 * kv.k_buffer.element_size()
    snap = StateSnapshotPool.bytes_per_snapshot(caches.req_manager.linear_state)
    assert (budget.kv_bytes_per_token, budget.snapshot_bytes) == (kv_bytes, snap)
    assert (kv.size, caches.snapshots.size) == (budget.kv_tokens, budget.num_snapshots)
    assert budget.total_bytes <= 600 * kv_bytes and budget.num_snapshots * snap >= 0.5 * 600 * kv_bytes - snap
    assert engine.scheduler.kv_capacity == kv.size
    shared = [(7 * i) % 300 + 3 for i in range(30)]
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    llm.generate([shared + [1, 2]], params)
    outs = llm.generate([shared + [i, i + 1] for i in range(3, 9)], params)
    assert all(o.num_cached_tokens >= 24 for o in outs)
    tree = engine.prefix_cache.tree
    tree.check()
    assert kv.num_free + tree.num_tokens == kv.size and tree.num_locked == 0
    assert tree.snapshot_allocator.num_free + tree.num_snapshots == caches.snapshots.size
    engine.evict_prefix_cache()
    assert kv.num_free == kv.size and tree.snapshot_allocator.num_free == caches.snapshots.size
    assert torch.equal(tree.kv_pool.allocator._in_use, torch.zeros_like(tree.kv_pool.allocator._in_use))

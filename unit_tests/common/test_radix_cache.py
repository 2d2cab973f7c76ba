"""The radix tree of the prefix cache: matching, (L+1)-gram keys, node splits, locks, LRU eviction, snapshots."""

import torch

from lightllm_mtp.common.kv_pool import KvPool
from lightllm_mtp.common.radix_cache import RadixCache, key_elements


def make(size=64, snapshots=4):
    pool = KvPool(1, size, 1, 2, torch.float32, torch.device("cpu"))
    return pool, RadixCache(pool, snapshots)


def insert(tree, pool, tokens, lookahead=0, snap_at=(), salt=None):
    n = len(tokens) - lookahead
    slots = pool.alloc(n)
    snaps = {d: tree.alloc_snapshot() for d in snap_at}
    node, tree_slots, unused = tree.insert(key_elements(tokens, n, lookahead, salt), slots, snaps)
    pool.free(slots[slots != tree_slots])
    for s in unused:
        tree.free_snapshot(s)
    return node, tree_slots


def test_shared_prefix_splits_and_keeps_the_first_slots():
    pool, tree = make()
    _, first = insert(tree, pool, [1, 2, 3, 4, 5], snap_at=[2, 5])
    _, second = insert(tree, pool, [1, 2, 3, 9], snap_at=[4])
    assert torch.equal(second[:3], first[:3]) and second[3] != first[3]
    assert tree.num_tokens == 6 and pool.num_free == 64 - 6
    path = tree.match(key_elements([1, 2, 3, 9, 7], 5, 0))
    assert [n.depth for n in path] == [2, 3, 4] and path[-1].snapshot is not None
    assert path[0].snapshot is not None and path[1].snapshot is None


def test_lookahead_keys_branch_before_the_divergence():
    """With L = 1 a slot is keyed by its token and the next: sequences that differ at position 4 share 0..2."""
    pool, tree = make()
    _, first = insert(tree, pool, [1, 2, 3, 4, 5, 6], lookahead=1)
    _, second = insert(tree, pool, [1, 2, 3, 4, 9, 9], lookahead=1)
    assert torch.equal(second[:3], first[:3]) and second[3] != first[3]
    assert [n.depth for n in tree.match(key_elements([1, 2, 3, 4, 9, 9], 5, 1))] == [3, 5]


def test_paths_of_different_salts_share_nothing():
    """cache_salt partitions the tree: the same tokens under another salt (or none) get their own path from the
    root, and a lookup finds only its own salt's path."""
    pool, tree = make()
    _, unsalted = insert(tree, pool, [1, 2, 3, 4], snap_at=[4])
    _, a = insert(tree, pool, [1, 2, 3, 4], snap_at=[4], salt="a")
    _, b = insert(tree, pool, [1, 2, 3, 4], lookahead=1, salt="b")
    assert len({*unsalted.tolist(), *a.tolist(), *b.tolist()}) == 4 + 4 + 3 and len(tree.root.children) == 3
    _, again = insert(tree, pool, [1, 2, 3, 9], salt="a")  # same salt: shares the prefix
    assert torch.equal(again[:3], a[:3]) and tree.num_tokens == 4 + 4 + 3 + 1
    assert [n.depth for n in tree.match(key_elements([1, 2, 3, 4], 4, 0, "a"))] == [3, 4]
    assert tree.match(key_elements([1, 2, 3, 4], 4, 0, "c")) == []
    assert tree.match(key_elements([1, 2, 3, 4], 4, 0))[-1].slots.tolist() == unsalted.tolist()
    tree.check()


def test_locked_nodes_survive_eviction_and_lru_order():
    pool, tree = make(size=16)
    old, _ = insert(tree, pool, [1, 2, 3, 4], snap_at=[4])
    new, _ = insert(tree, pool, [7, 8, 9], snap_at=[3])
    tree.lock(old)
    assert tree.num_locked == 4 and tree.num_evictable == 3
    assert tree.evict(10) == 3 and tree.num_tokens == 4  # only the unlocked leaf goes
    tree.unlock(old)
    tree.evict_all()
    assert tree.num_tokens == 0 and pool.num_free == 16 and tree.num_snapshots == 0


def test_pool_reclaims_from_the_tree_and_snapshot_lru():
    pool, tree = make(size=8, snapshots=2)
    insert(tree, pool, [1, 2, 3, 4], snap_at=[4])
    insert(tree, pool, [5, 6, 7, 8], snap_at=[4])
    assert pool.num_free == 0
    slots = tree.alloc_kv(3)  # evicts the least recently used leaf
    assert slots.numel() == 3 and tree.num_tokens == 4
    insert(tree, pool, [9], snap_at=[1])
    snap = tree.alloc_snapshot()  # both slots in use: the older snapshot goes, and its leaf with it
    assert snap is not None and tree.num_tokens == 1


def test_partial_snapshots_stay_partial_through_the_host_tier():
    """A draft model's partial snapshot (the target's half only) keeps the flag when it is offloaded and fetched back,
    and the host tier carries every pool a snapshot slot spans (target and draft)."""
    from lightllm_mtp.common.host_snapshots import HostSnapshotTier
    from lightllm_mtp.common.linear_att_state import LinearAttState
    from lightllm_mtp.common.state_snapshots import StateSnapshotPool

    cpu = torch.device("cpu")
    states = [LinearAttState(2, 2, 6, 4, 1, 2, 3, torch.float32, cpu, num_draft_tokens=k) for k in (2, 3)]
    pools = [StateSnapshotPool(s, 2) for s in states]
    kv = KvPool(1, 64, 1, 2, torch.float32, torch.device("cpu"))
    tree = RadixCache(kv, 2, HostSnapshotTier(pools[0], 2, pools[1]))
    node, _ = insert(tree, kv, [1, 2, 3], snap_at=[3])
    node.snapshot.partial = True
    for i, p in enumerate(pools):
        p.conv[:, node.snapshot.slot] = i + 1.0
        p.ssm[:, node.snapshot.slot] = i + 3.0
    insert(tree, kv, [4, 5], snap_at=[2])
    insert(tree, kv, [6, 7], snap_at=[2])  # the first snapshot is the least recently used: offloaded
    assert node.snapshot.on_host and node.snapshot.partial
    for p in pools:
        p.conv.zero_()
        p.ssm.zero_()
    assert tree.fetch(node) and not node.snapshot.on_host and node.snapshot.partial
    for i, p in enumerate(pools):
        slot = node.snapshot.slot
        assert bool((p.conv[:, slot] == i + 1.0).all()) and bool((p.ssm[:, slot] == i + 3.0).all())


def test_insert_below_a_node_adds_only_the_new_positions_and_the_lock_moves_down():
    """A growing prompt extends the path below the node it holds (engine/prefix_cache.py _adopt): the same tree as
    inserting the whole prefix from the root, the slots of the new positions only, and lock(node, until=held) leaves
    the path above counted once."""
    tokens = list(range(10, 40))
    pool, tree = make()
    held, _ = insert(tree, pool, tokens[:12], snap_at=[8, 12])
    tree.lock(held)
    slots = pool.alloc(18)
    snaps = {16: tree.alloc_snapshot(), 30: tree.alloc_snapshot(), 4: tree.alloc_snapshot()}
    node, new_slots, unused = tree.insert(key_elements(tokens[12:], 18, 0), slots, snaps, below=held)
    assert torch.equal(new_slots, slots) and node.depth == 30 and unused == [snaps[4]]  # depth 4 is above `held`
    tree.free_snapshot(snaps[4])
    tree.lock(node, until=held)
    assert tree.num_locked == 30
    path = tree.match(key_elements(tokens, 30, 0))
    assert [n.depth for n in path] == [8, 12, 16, 30] and all(n.lock_ref == 1 for n in path)
    twin_pool, twin = make()  # the whole prompt inserted from the root in one go
    insert(twin, twin_pool, tokens, snap_at=[8, 12, 16, 30])
    assert [n.depth for n in twin.match(key_elements(tokens, 30, 0))] == [8, 12, 16, 30]
    tree.unlock(node)
    assert tree.num_locked == 0
    tree.check()
    tree.evict_all()
    assert pool.num_free == 64 and tree.snapshot_allocator.num_free == 4

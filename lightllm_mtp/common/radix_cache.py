"""A radix tree over token keys that owns shared full-attention KV slots and linear-attention state snapshots.

Token granularity (page size 1, the KV pool's). A key element is the (L+1)-gram `tokens[p : p+L+1]` of position p,
where L is the MTP draft lookahead (0 without MTP): a KV slot holds the target's KV of position p and every draft
module's KV, and module m's KV at p depends on the tokens up to p+m+1 (docs/ARCHITECTURE.md, "Draft KV
convention"). Keying by (L+1)-grams makes two sequences that branch at position d share slots only below d-L, so
every shared slot holds the committed value of the path it is reached by.

A node may carry a snapshot (a StateSnapshotPool slot: the GDN state after its last position). Locked nodes (a
running request resumes from or extends them) and their ancestors are never evicted; unlocked leaves go in LRU
order. Snapshots go in LRU order too (unless pinned between admission and restore); a leaf left without a snapshot
below it is useless and goes with it.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import torch

from lightllm_mtp.common.host_snapshots import HostSnapshotTier
from lightllm_mtp.common.kv_pool import KvPool
from lightllm_mtp.common.slot_allocator import SlotAllocator

Key = tuple  # one key element: the (L+1)-gram of a position


def key_elements(tokens: list[int], n: int, lookahead: int, salt: str | None = None) -> list[Key]:
    """The keys of positions 0..n-1 (tokens must reach position n - 1 + lookahead). salt: a request's cache_salt,
    put in front of position 0's key (a tuple of another length than any unsalted key), so that paths of different
    salts part at the root and share no node."""
    if n + lookahead > len(tokens):
        raise ValueError(f"keys of {n} positions need {n + lookahead} tokens, got {len(tokens)}")
    if n <= 0:
        return []
    keys = list(zip(*(tokens[i : i + n] for i in range(lookahead + 1))))  # tuples tokens[p : p + lookahead + 1]
    if salt is not None:
        keys[0] = (salt, *keys[0])
    return keys


@dataclass(eq=False)
class Snapshot:
    slot: int
    pins: int = 0  # admitted requests that still have to restore it
    last_access: int = 0
    on_host: bool = False  # slot is a HostSnapshotTier slot (offloaded; fetched back on a hit)
    # a draft model's half is not valid (its state there was gone): the draft resumes from an ancestor's snapshot
    # and catches up (engine/prefix_cache.py)
    partial: bool = False


@dataclass(eq=False)
class Node:
    key: list[Key]
    slots: torch.Tensor  # [len(key)] int32 KV slots
    parent: Node | None
    depth: int  # positions from the root to this node's end
    children: dict[Key, Node] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    snapshot: Snapshot | None = None
    serial: int = 0  # creation order: eviction's tie-break (deterministic, so that tp / pp ranks evict alike)


class RadixCache:
    def __init__(self, kv_pool: KvPool, num_snapshots: int, host: HostSnapshotTier | None = None):
        self.kv_pool = kv_pool
        self.host = host  # where evicted snapshots go (None: they are dropped)
        self.root = Node([], torch.empty(0, dtype=torch.int32), None, 0, lock_ref=1)
        self.snapshot_allocator = SlotAllocator(num_snapshots, "state snapshots")
        self.num_tokens = 0  # KV slots owned by the tree
        self.num_locked = 0  # of which in locked nodes
        self._snapshot_holders: dict[Node, None] = {}  # the nodes with a snapshot (eviction scans these only)
        self._clock = itertools.count(1)
        self._serials = itertools.count(1)

    # ---- lookup -------------------------------------------------------------------------------------------------
    def match(self, keys: list[Key]) -> list[Node]:
        """The nodes whose whole key is a prefix of `keys`, root first (root excluded)."""
        path, node, i, now = [], self.root, 0, next(self._clock)
        while i < len(keys) and keys[i] in node.children:
            child = node.children[keys[i]]
            n = len(child.key)
            if child.key != keys[i : i + n]:
                break
            child.last_access = now
            if child.snapshot is not None:
                child.snapshot.last_access = now
            path.append(child)
            node, i = child, i + n
        return path

    @staticmethod
    def path_slots(node: Node, above: Node | None = None) -> torch.Tensor:
        """The KV slots of the positions from below `above` (default: the root) down to node's end."""
        parts = []
        while node.parent is not None and node is not above:
            parts.append(node.slots)
            node = node.parent
        return torch.cat(parts[::-1]) if parts else torch.empty(0, dtype=torch.int32)

    # ---- locks --------------------------------------------------------------------------------------------------
    def lock(self, node: Node, until: Node | None = None) -> None:
        """Locks node and its ancestors up to `until` (excluded; default: the root). A holder that locked `until`
        moves its lock down to a descendant `node` with lock(node, until): the path above stays counted once."""
        while node is not self.root and node is not until:
            if node.lock_ref == 0:
                self.num_locked += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            assert node.lock_ref >= 0
            if node.lock_ref == 0:
                self.num_locked -= len(node.key)
            node = node.parent

    @property
    def num_evictable(self) -> int:
        return self.num_tokens - self.num_locked

    # ---- insertion ----------------------------------------------------------------------------------------------
    def insert(self, keys: list[Key], slots: torch.Tensor, snapshots: dict[int, Snapshot],
               below: Node | None = None) -> tuple[Node, torch.Tensor, list[Snapshot]]:  # fmt: skip
        """Adds the path `keys` with KV `slots` (host int32) below node `below` (default: the root; keys and slots
        then start at position below.depth, so that a growing prompt adds only its new positions); positions already
        in the tree keep the tree's slots. snapshots: depth -> snapshot to attach at that depth (a node boundary is
        made there). Returns the node at below.depth + len(keys), the tree's slots of the positions of `keys` (the
        caller frees its own where they differ) and the snapshots not attached (a snapshot was there already, or the
        depth is outside the keys): the caller frees them."""
        assert len(keys) == slots.numel()
        top = self.root if below is None else below
        base, end, now = top.depth, top.depth + len(keys), next(self._clock)
        node, i = top, base
        cuts = sorted(d for d in snapshots if base < d <= end)
        while i < end:
            stop = next((d for d in cuts if d > i), end)  # do not cross a snapshot depth inside one node
            child = node.children.get(keys[i - base])
            if child is None:
                child = Node(keys[i - base : stop - base], slots[i - base : stop - base].clone(), node, stop,
                             serial=next(self._serials))  # fmt: skip
                node.children[keys[i - base]] = child
                self.num_tokens += stop - i
            else:
                n = _common_prefix(child.key, keys[i - base : stop - base])
                if n < len(child.key):
                    child = self._split(child, n)
            child.last_access = now
            node, i = child, child.depth
        unused = [s for d, s in snapshots.items() if not base < d <= end]
        for d in cuts:
            owner = self._node_at(node, d)
            if owner.snapshot is None:
                snapshots[d].last_access = now
                self.attach_snapshot(owner, snapshots[d])
            else:
                unused.append(snapshots[d])
        return node, self.path_slots(node, above=top), unused

    def _node_at(self, node: Node, depth: int) -> Node:
        while node.depth != depth:
            node = node.parent
        return node

    def _split(self, child: Node, n: int) -> Node:
        """Cuts `child` after n positions; returns the new upper part."""
        parent = child.parent
        upper = Node(child.key[:n], child.slots[:n], parent, child.depth - len(child.key) + n,
                     lock_ref=child.lock_ref, last_access=child.last_access, serial=next(self._serials))  # fmt: skip
        parent.children[child.key[0]] = upper
        child.key, child.slots, child.parent = child.key[n:], child.slots[n:], upper
        upper.children[child.key[0]] = child
        return upper

    # ---- snapshots ----------------------------------------------------------------------------------------------
    def attach_snapshot(self, node: Node, snapshot: Snapshot) -> None:
        """node (without one) now carries snapshot."""
        assert node.snapshot is None
        node.snapshot = snapshot
        self._snapshot_holders[node] = None

    def alloc_snapshot(self) -> Snapshot | None:
        """A free snapshot slot, evicting the least recently used unpinned snapshot if needed; None if all pinned."""
        if self.snapshot_allocator.num_free == 0 and not self._evict_one_snapshot():
            return None
        return Snapshot(int(self.snapshot_allocator.alloc(1)[0]), last_access=next(self._clock))

    def free_snapshot(self, snapshot: Snapshot) -> None:
        allocator = self.host.allocator if snapshot.on_host else self.snapshot_allocator
        allocator.free(torch.tensor([snapshot.slot], dtype=torch.int32))

    def _evict_one_snapshot(self) -> bool:
        """Frees a device snapshot slot: the least recently used unpinned one moves to the host tier (making room
        there by dropping its least recently used one) or, without a tier, is dropped."""
        candidates = [n for n in self._snapshot_nodes(on_host=False) if n.snapshot.pins == 0]
        if not candidates:
            return False
        node = min(candidates, key=lambda n: n.snapshot.last_access)
        snap = node.snapshot
        if self.host is not None and self.host.allocator.num_free == 0:
            on_host = [n for n in self._snapshot_nodes(on_host=True) if n.snapshot.pins == 0]
            if on_host:
                self._drop_snapshot(min(on_host, key=lambda n: n.snapshot.last_access))
        if self.host is not None and self.host.allocator.num_free > 0:
            host_slot = int(self.host.allocator.alloc(1)[0])
            self.host.offload(snap.slot, host_slot)
            self.free_snapshot(snap)
            node.snapshot = Snapshot(host_slot, last_access=snap.last_access, on_host=True, partial=snap.partial)
            return True
        self._drop_snapshot(node)
        return True

    def _snapshot_nodes(self, on_host: bool) -> list[Node]:
        return [n for n in self._snapshot_holders if n.snapshot.on_host == on_host]

    def _drop_snapshot(self, node: Node) -> None:
        self.free_snapshot(node.snapshot)
        node.snapshot = None
        del self._snapshot_holders[node]
        self._drop_useless(node)

    def fetch(self, node: Node) -> bool:
        """Brings node's offloaded snapshot back into a device slot; False (it stays on the host) when every device
        snapshot is pinned."""
        snap = node.snapshot
        snap.pins += 1  # not dropped by the host-tier room the allocation below may make
        device = self.alloc_snapshot()
        snap.pins -= 1
        if device is None:
            return False
        self.host.fetch(snap.slot, device.slot)
        self.free_snapshot(snap)
        device.partial = snap.partial
        node.snapshot = device
        return True

    def _drop_useless(self, node: Node) -> None:
        """Removes unlocked leaves without a snapshot, from `node` upwards (nothing can resume inside them)."""
        while node is not self.root and not node.children and node.lock_ref == 0 and node.snapshot is None:
            parent = node.parent
            self._remove_leaf(node)
            node = parent

    # ---- eviction -----------------------------------------------------------------------------------------------
    def alloc_kv(self, n: int) -> torch.Tensor:
        """n KV slots of the pool ([n] int32, host) for a running request, evicting unlocked leaves first when fewer
        are free."""
        missing = n - self.kv_pool.num_free
        if missing > 0:
            self.evict(missing)
        return self.kv_pool.alloc(n)

    def evict(self, num_tokens: int) -> int:
        """Frees at least num_tokens KV slots from unlocked leaves, least recently used first (their snapshots go
        too); returns the number freed (less when not enough is unlocked)."""
        freed = 0
        heap = [(n.last_access, n.serial, n) for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            freed += len(node.key)
            self._remove_leaf(node)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.serial, parent))
        return freed

    def evict_all(self) -> None:
        self.evict(self.num_tokens)

    def _remove_leaf(self, node: Node) -> None:
        assert not node.children and node.lock_ref == 0
        if node.snapshot is not None:
            assert node.snapshot.pins == 0
            self.free_snapshot(node.snapshot)
            node.snapshot = None
            del self._snapshot_holders[node]
        del node.parent.children[node.key[0]]
        self.kv_pool.free(node.slots)
        self.num_tokens -= len(node.key)

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def check(self) -> None:
        """Consistency (tests): tree slots are distinct and allocated, counts match, snapshots distinct and allocated."""
        nodes = list(self._nodes())
        slots = torch.cat([n.slots for n in nodes]) if nodes else torch.empty(0, dtype=torch.int32)
        assert slots.unique().numel() == slots.numel() == self.num_tokens, "tree slots repeated or miscounted"
        assert bool(self.kv_pool.allocator._in_use[slots.long()].all()), "a tree slot is on the free list"
        assert self.num_locked == sum(len(n.key) for n in nodes if n.lock_ref > 0), "locked count drifted"
        for on_host, allocator in ((False, self.snapshot_allocator), (True, self.host and self.host.allocator)):
            snaps = [n.snapshot.slot for n in nodes if n.snapshot is not None and n.snapshot.on_host == on_host]
            assert len(set(snaps)) == len(snaps), "a snapshot slot on two nodes"
            assert all(bool(allocator._in_use[s]) for s in snaps), "a tree snapshot is free"
        for n in nodes:
            assert n.parent.children[n.key[0]] is n and n.depth == n.parent.depth + len(n.key)
        assert set(self._snapshot_holders) == {n for n in nodes if n.snapshot is not None}, "snapshot holders drifted"

    @property
    def num_snapshots(self) -> int:
        return self.snapshot_allocator.size - self.snapshot_allocator.num_free

    @property
    def num_host_snapshots(self) -> int:
        return self.host.allocator.size - self.host.allocator.num_free if self.host is not None else 0


def _common_prefix(a: list, b: list) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n

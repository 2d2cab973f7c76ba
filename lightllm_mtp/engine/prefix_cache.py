"""The prefix cache, engine side: which cached prefix a new request resumes from, the GDN snapshots its prompt
chunks take, and what a request leaves in the tree (common/radix_cache.py) when it ends.

A request resumes at the deepest tree node carrying a GDN snapshot along its prompt's keys; its KV slots up to
there are shared (locked) and the rest of the prompt is recomputed. Keys cover positions whose L = draft lookahead
following tokens are prompt tokens, so at least max(1, L) prompt tokens are always recomputed: the last one for
its logits and, under MTP, the rows whose draft KV depends on tokens after the prefix.

What enters the tree is committed only: KV of positions p whose tokens up to p + L are known (multi-layer MTP's
provisional draft rows never do), snapshots of prompt-chunk boundaries and of a finished request's committed GDN
state (under MTP its conv window / SSM row at accept_len - 1, never verify rows). Under MTP with overlap a request
may end while its next verify is queued: its state then moves past what the host knows, so the state after that
verify's first row (the newest token, committed) is snapshotted and enters the tree once the verify's first emitted
token, the last key's lookahead, reaches the host (eagle / PTD). Under multi-layer MTP (L modules) the tree's end lags
the committed state by L - 1 positions: its snapshot is the last verify's SSM row / conv window L - 1 before the
committed one, when that verify accepted at least L rows (else the request leaves no end snapshot).

With an external draft model (mtp_mode draft_model) a snapshot slot holds the draft's GDN state beside the target's
(a second StateSnapshotPool, same slot indices, one budget) and a tree KV slot the draft's KV too (the draft's pool is
indexed by the target's slots). The draft's KV at position p depends on tokens 0..p only, so L = 0. Prompt chunks run
through both models with the same SnapshotPlan, so boundary snapshots hold both states at the same depth, and a hit
restores both and recomputes the rest of the prompt in both. The draft has read one token more than the target once
a request generates (its window pass reads the newest token), so a finished request's end snapshot takes the
draft's state one position before its committed one: the last verify's row accept_len - 2, when that verify accepted
a draft. Otherwise (accept length 1, or a verify of it still queued: the end is then the state after that verify's
row 0, entering the tree at once since L = 0) the draft's state there is gone and the snapshot is `partial`, the
target's half only: a hit on it restores the draft from the deepest complete snapshot above it (or none) and advances
the draft's GDN state over the tokens between (DraftModelProposer.catch_up: a draft-only prefill of those tokens, whose
draft KV the tree's slots already hold), then both recompute the rest of the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from lightllm_mtp.common.radix_cache import Node, RadixCache, Snapshot, key_elements
from lightllm_mtp.common.req_manager import ReqManager
from lightllm_mtp.common.state_snapshots import SnapshotPlan, StateSnapshotPool, build_snapshot_plan
from lightllm_mtp.engine.request import CacheHold, DraftResume, EndState, QueuedVerifyEnd, Request
from lightllm_mtp.kernels.gdn.gated_delta_rule_states import state_save_alignment
from lightllm_mtp.kernels.triton_utils import to_device_async


@dataclass(frozen=True)
class PrefixCacheStats:
    queries: int  # requests admitted
    hits: int  # of which resumed from a cached prefix
    prompt_tokens: int
    cached_tokens: int  # prompt tokens not computed thanks to the cache
    tree_tokens: int  # KV slots owned by the tree
    snapshots: int  # snapshot slots in use
    snapshot_capacity: int
    host_snapshots: int = 0  # offloaded snapshots in the pinned host tier
    host_fetches: int = 0  # offloaded snapshots brought back for a hit
    draft_catch_up_tokens: int = 0  # draft model: tokens its GDN state was advanced over on hits of partial snapshots

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class CacheJournal(Protocol):
    """tp / pp: the driver's record of the calls that change the tree outside a runner call (engine/parallel/): the
    followers replay them on their copies in the same order."""

    def cache_match(self, req: Request) -> None: ...

    def cache_unmatch(self, req: Request) -> None: ...

    def cache_evict_all(self) -> None: ...


class PrefixCache:
    def __init__(self, tree: RadixCache, snapshots: StateSnapshotPool, req_manager: ReqManager, interval: int,
                 lookahead: int, draft_snapshots: StateSnapshotPool | None = None,
                 draft_catch_up: Callable[[int, list[int], int], None] | None = None,
                 journal: CacheJournal | None = None):  # fmt: skip
        self.tree = tree
        self.snapshots = snapshots
        self.draft_snapshots = draft_snapshots  # the draft model's half of every snapshot slot (mtp_mode draft_model)
        self.draft_catch_up = draft_catch_up  # (request slot, tokens, start): DraftModelProposer.catch_up
        self.req_manager = req_manager
        self.interval = interval
        self.lookahead = lookahead  # L: draft-KV lookahead of the MTP proposer (0 without MTP)
        self.journal = journal  # the driver's under tp / pp (None: one process, or a follower replaying)
        self._pending: list[tuple[Request, list[tuple[int, Snapshot]]]] = []
        self.reset_stats()

    def alloc_kv(self, n: int) -> torch.Tensor:
        """n KV slots for a running request; unlocked cached prefixes are evicted (LRU leaves) when too few are free."""
        return self.tree.alloc_kv(n)

    # ---- admission ----------------------------------------------------------------------------------------------
    def match(self, req: Request) -> int:
        """Locks the deepest usable cached prefix of req's prompt; returns its length (0: none)."""
        if self.journal is not None:
            self.journal.cache_match(req)
        prompt = req.key_prompt_ids
        n = len(prompt) - max(1, self.lookahead)
        if n <= 0:
            return 0
        path = self.tree.match(key_elements(prompt, n, self.lookahead, req.params.cache_salt))
        # the deepest snapshot; an offloaded one comes back to the device first (if a device slot can be had)
        resumable = (x for x in reversed(path) if x.snapshot is not None and (not x.snapshot.on_host or self._fetch(x)))
        node = next(resumable, None)
        if node is None:
            return 0
        self.tree.lock(node)
        node.snapshot.pins += 1
        hold = req.cache_hold
        hold.draft_resume = self._draft_resume(path, node) if node.snapshot.partial else None
        hold.node, hold.resume = node, node.snapshot
        req.kv_slots = [self.tree.path_slots(node)]
        req.num_computed = node.depth
        return node.depth

    def _draft_resume(self, path: list[Node], node: Node) -> DraftResume:
        """For a snapshot without the draft's half: the deepest complete snapshot above it on the path (pinned until
        the restore) and its depth, where the draft resumes; (None, 0): the draft starts from nothing."""
        for x in reversed(path[: path.index(node)]):
            if x.snapshot is not None and not x.snapshot.partial and (not x.snapshot.on_host or self._fetch(x)):
                x.snapshot.pins += 1
                return DraftResume(x.snapshot, x.depth)
        return DraftResume(None, 0)

    def _unpin_draft_resume(self, hold: CacheHold) -> None:
        if hold.draft_resume is not None and hold.draft_resume.snapshot is not None:
            hold.draft_resume.snapshot.pins -= 1
        hold.draft_resume = None

    def _fetch(self, node: Node) -> bool:
        fetched = self.tree.fetch(node)
        self._host_hits += fetched  # counted at the match (an unadmitted request's fetch stays on the device)
        return fetched

    def unmatch(self, req: Request) -> None:
        """Undoes `match` (the request was not admitted after all)."""
        if self.journal is not None:
            self.journal.cache_unmatch(req)
        hold = req.cache_hold
        if hold.node is not None:
            hold.resume.pins -= 1
            self._unpin_draft_resume(hold)
            self.tree.unlock(hold.node)
        hold.node, hold.resume, req.kv_slots, req.num_computed = None, None, [], 0

    def admitted(self, req: Request) -> None:
        cached = req.cache_hold.cached_len
        self._queries += 1
        self._prompt_tokens += len(req.prompt_ids)
        self._cached_tokens += cached
        self._hits += cached > 0
        req.num_cached_tokens = cached

    def restore(self, req: Request) -> None:
        """On the request's first step (its slot just taken): the snapshot into its GDN state, the shared slots into
        its page-table row."""
        hold = req.cache_hold
        snap = hold.resume
        if snap is None:
            return
        self.snapshots.restore(snap.slot, req.req_idx)
        slots = torch.cat(req.kv_slots)
        table = self.req_manager.req_to_token
        table[req.req_idx, : slots.numel()] = to_device_async(slots, table.device)  # pinned: never waits for the device
        if self.draft_snapshots is not None:
            self._restore_draft(req, snap, slots.numel())
        snap.pins -= 1
        hold.resume = None

    def _restore_draft(self, req: Request, snap: Snapshot, depth: int) -> None:
        """The draft's half of the snapshot; for a partial one, the draft's own resume point and its catch-up over
        the tokens from there to `depth` (its KV there is in the tree's slots, which the page table now points at)."""
        hold = req.cache_hold
        if hold.draft_resume is None:
            self.draft_snapshots.restore(snap.slot, req.req_idx)
            return
        draft_snap, start = hold.draft_resume.snapshot, hold.draft_resume.depth
        if draft_snap is not None:
            self.draft_snapshots.restore(draft_snap.slot, req.req_idx)
        self._unpin_draft_resume(hold)
        self.draft_catch_up(req.req_idx, req.prompt_ids[start:depth], start)
        self._catch_up_tokens += depth - start

    # ---- prompt chunks ------------------------------------------------------------------------------------------
    def plan(self, chunks: list[tuple[Request, int, int]], num_rows: int, device: torch.device) -> SnapshotPlan | None:
        """Snapshot slots for the boundaries of the step's prompt chunks (req, start, rows): every multiple of the
        interval and the prompt's end, deepest first while slots can be had (the GDN layers save the states in the
        chunk's prefill call: common/state_snapshots.py). Rows of decode requests take none."""
        cuts = []
        for req, start, n in chunks:
            c = []
            if start < len(req.prompt_ids):
                end = start + n
                points = list(range((start // self.interval + 1) * self.interval, end + 1, self.interval))
                if end == len(req.prompt_ids) and (not points or points[-1] != end):
                    points.append(end)
                for p in reversed(points):  # the deepest first: with few free snapshot slots they matter most
                    snap = self.tree.alloc_snapshot()
                    if snap is None:
                        break
                    c.insert(0, (p, snap))
            cuts.append(c)
        self._pending = [(req, c) for (req, _, _), c in zip(chunks, cuts) if c]
        if not self._pending:
            return None
        return build_snapshot_plan(
            [(s, n) for _, s, n in chunks], [s > 0 for _, s, _ in chunks],
            [[(p, snap.slot) for p, snap in c] for c in cuts], self.snapshots.conv_cols, num_rows, device,
            state_save_alignment(device),
        )  # fmt: skip

    def after_launch(self) -> None:
        """After the chunks' forward is queued: each request's committed prefix up to its last boundary joins the
        tree (its own slots where the tree had none, the tree's elsewhere: its page table is pointed there) and
        stays locked by it (the scheduler's reservation for it shrinks by as much). Boundaries within L of the
        prompt's end wait for the request's end."""
        pending, self._pending = self._pending, []
        for req, cuts in pending:
            limit = len(req.prompt_ids) - self.lookahead
            now = [(p, s) for p, s in cuts if p <= limit]
            req.cache_hold.pending += [(p, s) for p, s in cuts if p > limit]
            if now:
                self._adopt(req, now[-1][0], dict(now))

    def _adopt(self, req: Request, depth: int, snaps: dict[int, Snapshot]) -> None:
        """Only the positions past the node the request holds are keyed and inserted (below that node), and its lock
        moves down the path: the host work of a prompt chunk does not grow with the prompt's cached length."""
        hold = req.cache_hold
        start = hold.cached_len
        held, new = split_slots(req.kv_slots, start)  # kv_slots[..][:start] are the tree's already
        tokens = req.key_prompt_ids[start : depth + self.lookahead]
        keys = key_elements(tokens, depth - start, self.lookahead, req.params.cache_salt if start == 0 else None)
        own = new[: depth - start]
        node, tree_slots = self._insert(keys, own, snaps, below=hold.node)
        dup = own != tree_slots
        if bool(dup.any()):
            table = self.req_manager.req_to_token
            pos = dup.nonzero().flatten() + start
            dev = table.device  # non-blocking: a blocking copy would wait for the forward just queued
            table[req.req_idx, to_device_async(pos, dev)] = to_device_async(tree_slots[dup], dev)
            self.tree.kv_pool.free(own[dup])
        req.kv_slots = held + [tree_slots, new[depth - start :]]
        self.tree.lock(node, until=hold.node)  # the path above hold.node stays locked by this request once
        hold.node = node

    def _insert(self, keys: list, slots: torch.Tensor, snaps: dict[int, Snapshot],
                below: Node | None = None) -> tuple[Node, torch.Tensor]:  # fmt: skip
        """tree.insert, freeing the snapshots the tree did not take (a snapshot was there already)."""
        node, tree_slots, unused = self.tree.insert(keys, slots, snaps, below)
        for s in unused:
            self.tree.free_snapshot(s)
        return node, tree_slots

    # ---- end of a request ---------------------------------------------------------------------------------------
    def on_finish(self, req: Request, end: EndState) -> bool:
        """Before the request's slots are released (engine/request_end.py): its committed KV and a snapshot of its GDN
        state at the tree's end go into the tree; its lock is dropped; what the tree does not take is freed.
        req.kv_slots is empty afterwards.

        end.held (MTP): the KV slot of its newest token's row in a verify already queued (overlap). That verify
        commits the row: with a draft model the position joins the tree now (_join_queued_row); under eagle / PTD
        (L = 1) the state after that row is snapshotted now and the position joins the tree once the verify's first
        emitted token (its key's lookahead) reaches the host (_defer_queued_row): returns True, the request then
        awaits that verify (after_queued_verify) with its end node locked."""
        hold = req.cache_hold
        if hold.resume is not None:  # ended before its first step
            hold.resume.pins -= 1
            hold.resume = None
            self._unpin_draft_resume(hold)
        kv = torch.cat(req.kv_slots) if req.kv_slots else torch.empty(0, dtype=torch.int32)
        total = kv.numel()
        depth = max(0, min(total, req.num_tokens - self.lookahead))
        snaps = self._pending_snapshots_within(req, depth)
        to_free = [kv[depth:]]
        held, awaiting = end.held, False
        if depth > 0:
            tokens = req.key_prompt_ids + req.output_ids
            keys = key_elements(tokens, depth, self.lookahead, req.params.cache_salt)
            node, tree_slots = self._insert(keys, kv[:depth], snaps)
            to_free.append(kv[:depth][kv[:depth] != tree_slots])
            self.tree.lock(node)  # the allocations below may evict unlocked leaves
            if req.req_idx is not None and node.snapshot is None:
                self._snapshot_end(req, node, end, total - depth)
            if held is not None and depth == total == req.num_tokens - 1:
                if self.draft_snapshots is not None:
                    held = self._join_queued_row(req, tokens, depth, tree_slots, held)
                elif self.lookahead == 1 and req.req_idx is not None:
                    held, awaiting = self._defer_queued_row(req, node, held)
            self.tree.unlock(node)
        else:
            for s in snaps.values():
                self.tree.free_snapshot(s)
        if held is not None:
            to_free.append(held)
        if hold.node is not None:
            self.tree.unlock(hold.node)
            hold.node = None
        if awaiting:
            hold.node = node  # locked by _defer_queued_row
        self.tree.kv_pool.free(torch.cat(to_free))
        req.kv_slots = []
        return awaiting

    def _pending_snapshots_within(self, req: Request, depth: int) -> dict[int, Snapshot]:
        """The request's prompt-end snapshots that the tree's end (depth) reaches, by position; the others are freed."""
        hold, snaps = req.cache_hold, {}
        for p, s in hold.pending:
            if p <= depth and p not in snaps:
                snaps[p] = s
            else:
                self.tree.free_snapshot(s)
        hold.pending = []
        return snaps

    def _snapshot_end(self, req: Request, node: Node, end: EndState, lag: int) -> None:
        """A snapshot of the state after position node.depth - 1, `lag` positions before the committed one: the
        committed state itself (plain, eagle, PTD: lag 0), or under multi-layer MTP (lag L - 1) the last verify's row
        that many before it, when that verify kept it. A draft model's state is one position ahead once the request
        generates: its half is the row before, or missing (a partial snapshot) when that row is gone."""
        offset = end.state_at(lag)
        if offset is None:
            return
        snap = self.tree.alloc_snapshot()
        if snap is None:
            return
        self.snapshots.save(snap.slot, req.req_idx, offset)
        if self.draft_snapshots is not None:
            draft_offset = end.state_at(lag + (1 if req.blocks else 0))
            if draft_offset is None:
                snap.partial = True
            else:
                self.draft_snapshots.save(snap.slot, req.req_idx, draft_offset)
        self.tree.attach_snapshot(node, snap)

    def _join_queued_row(self, req: Request, tokens: list[int], depth: int, tree_slots: torch.Tensor,
                         held: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        """Draft model (L = 0): position `depth` (its newest token, slot `held`, committed by the queued verify) joins
        the tree now, its key being its own token, with a partial snapshot of the state after that verify's row 0
        (queued after it). Returns held, or None when the tree took it."""
        snap = self.tree.alloc_snapshot() if req.req_idx is not None else None
        if snap is None:
            return held
        self.snapshots.save(snap.slot, req.req_idx, 0)
        snap.partial = True  # the draft's state after that row was overwritten by the verify's window pass
        keys = key_elements(tokens, depth + 1, 0, req.params.cache_salt)
        _, slots = self._insert(keys, torch.cat([tree_slots, held]), {depth + 1: snap})
        return None if int(slots[-1]) == int(held[0]) else held

    def _defer_queued_row(self, req: Request, node: Node, held: torch.Tensor) -> tuple[torch.Tensor | None, bool]:
        """Eagle / PTD (L = 1): the state after the queued verify's row 0 is snapshotted now (queued after that
        verify); the position joins the tree below `node`, which stays locked, once the verify's first emitted token
        arrives (after_queued_verify). Returns (held, False) when no snapshot can be had, else (None, True)."""
        snap = self.tree.alloc_snapshot()
        if snap is None:
            return held, False
        self.snapshots.save(snap.slot, req.req_idx, 0)  # queued after that verify: its row 0
        self.tree.lock(node)  # until that verify's token arrives
        req.cache_hold.queued_end = QueuedVerifyEnd(held, snap)
        return None, True

    def after_queued_verify(self, req: Request, emitted: list[int]) -> None:
        """The end of a request that awaited a queued verify (on_finish returned True): its newest position (the held
        KV slot) joins the tree below its end node with the snapshot, keyed by the token that verify emitted after
        it (nothing emitted: both are freed); the end node's lock goes."""
        hold = req.cache_hold
        node, end = hold.node, hold.queued_end
        depth = node.depth
        if emitted:
            tokens = (req.key_prompt_ids + req.output_ids)[: depth + 1] + emitted[:1]
            kv = torch.cat([self.tree.path_slots(node), end.held])
            keys = key_elements(tokens, depth + 1, 1, req.params.cache_salt)
            _, tree_slots = self._insert(keys, kv, {depth + 1: end.snapshot})
            if int(tree_slots[-1]) != int(end.held[0]):
                self.tree.kv_pool.free(end.held)
        else:
            self.tree.free_snapshot(end.snapshot)
            self.tree.kv_pool.free(end.held)
        self.tree.unlock(node)
        hold.node, hold.queued_end = None, None

    def evict_all(self) -> None:
        """Drops every unlocked cached prefix (its KV slots and snapshots go back to their pools)."""
        if self.journal is not None:
            self.journal.cache_evict_all()
        self.tree.evict_all()

    def digest(self) -> list[int]:
        """What every tp / pp rank's copy agrees on between steps: free KV slots, tree slots, locked ones, device and
        host snapshots, free request slots."""
        t = self.tree
        return [t.kv_pool.num_free, t.num_tokens, t.num_locked, t.num_snapshots, t.num_host_snapshots,
                self.req_manager.num_free]  # fmt: skip

    def reset_stats(self) -> None:
        """Counters at zero (at start, and after the start-up warm-up, engine/warm_up.py)."""
        self._queries = self._hits = self._prompt_tokens = self._cached_tokens = self._host_hits = 0
        self._catch_up_tokens = 0

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self._queries, self._hits, self._prompt_tokens, self._cached_tokens,
                                self.tree.num_tokens, self.tree.num_snapshots, self.snapshots.size,
                                self.tree.num_host_snapshots, self._host_hits, self._catch_up_tokens)  # fmt: skip


def split_slots(parts: list[torch.Tensor], n: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A request's KV slot pieces (position order) cut at position n: (the pieces of positions 0..n-1, the slots from
    n on in one tensor). Only the pieces past n are concatenated."""
    head, offset = [], 0
    for i, part in enumerate(parts):
        if offset + part.numel() > n:
            cut = n - offset
            if cut > 0:
                head.append(part[:cut])
            rest = [part[cut:], *parts[i + 1 :]]
            return head, torch.cat(rest) if len(rest) > 1 else rest[0]
        head.append(part)
        offset += part.numel()
    if offset < n:
        raise ValueError(f"split_slots: {offset} slots, cut at {n}")
    return head, torch.empty(0, dtype=torch.int32)

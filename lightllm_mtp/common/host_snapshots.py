"""A pinned host-memory tier for GDN state snapshots the device pool evicts (prefix cache, --prefix_cache_host_gb).

A host slot holds what a snapshot slot holds in every pool it spans (the target's StateSnapshotPool, and with
mtp_mode draft_model the draft model's too: one snapshot slot index covers both), laid out slot-major (one
contiguous block per snapshot and pool). Copies run on the current stream, non-blocking: a device slot reused right
after its offload, or a host slot reused after its fetch, is ordered behind the copy by the stream; the host never
reads these buffers itself.
"""

from __future__ import annotations

import torch

from lightllm_mtp.common.slot_allocator import SlotAllocator
from lightllm_mtp.common.state_snapshots import StateSnapshotPool


class HostSnapshotTier:
    def __init__(self, pool: StateSnapshotPool, num_slots: int, draft: StateSnapshotPool | None = None):
        """pool: the target's snapshots; draft: the draft model's (same slot indices), offloaded with them."""
        self.pool = pool
        self.pools = [pool] + ([draft] if draft is not None else [])
        pin = pool.conv.is_cuda
        self.buffers = [
            (torch.zeros(num_slots, *p.conv[:, 0].shape, dtype=p.conv.dtype, pin_memory=pin),
             torch.zeros(num_slots, *p.ssm[:, 0].shape, dtype=p.ssm.dtype, pin_memory=pin))
            for p in self.pools
        ]  # fmt: skip
        self.conv, self.ssm = self.buffers[0]
        self.allocator = SlotAllocator(num_slots, "host state snapshots")

    @staticmethod
    def slots_for(pool_bytes_per_snapshot: int, host_gb: float) -> int:
        return int(host_gb * 2**30) // pool_bytes_per_snapshot

    def offload(self, device_slot: int, host_slot: int) -> None:
        for p, (conv, ssm) in zip(self.pools, self.buffers):
            conv[host_slot].copy_(p.conv[:, device_slot], non_blocking=True)
            ssm[host_slot].copy_(p.ssm[:, device_slot], non_blocking=True)

    def fetch(self, host_slot: int, device_slot: int) -> None:
        for p, (conv, ssm) in zip(self.pools, self.buffers):
            p.conv[:, device_slot].copy_(conv[host_slot], non_blocking=True)
            p.ssm[:, device_slot].copy_(ssm[host_slot], non_blocking=True)

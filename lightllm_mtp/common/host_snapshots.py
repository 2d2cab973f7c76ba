"""A pinned host-memory tier for GDN state snapshots the device pool evicts (prefix cache, --prefix_cache_host_gb).

A host slot holds what a StateSnapshotPool slot holds, laid out slot-major (one contiguous block per snapshot).
Copies run on the current stream, non-blocking: a device slot reused right after its offload, or a host slot reused
after its fetch, is ordered behind the copy by the stream; the host never reads these buffers itself.
"""

from __future__ import annotations

import torch

from lightllm_mtp.common.slot_allocator import SlotAllocator
from lightllm_mtp.common.state_snapshots import StateSnapshotPool


class HostSnapshotTier:
    def __init__(self, pool: StateSnapshotPool, num_slots: int):
        pin = pool.conv.is_cuda
        self.pool = pool
        self.conv = torch.zeros(num_slots, *pool.conv[:, 0].shape, dtype=pool.conv.dtype, pin_memory=pin)
        self.ssm = torch.zeros(num_slots, *pool.ssm[:, 0].shape, dtype=pool.ssm.dtype, pin_memory=pin)
        self.allocator = SlotAllocator(num_slots, "host state snapshots")

    @staticmethod
    def slots_for(pool_bytes_per_snapshot: int, host_gb: float) -> int:
        return int(host_gb * 2**30) // pool_bytes_per_snapshot

    def offload(self, device_slot: int, host_slot: int) -> None:
        self.conv[host_slot].copy_(self.pool.conv[:, device_slot], non_blocking=True)
        self.ssm[host_slot].copy_(self.pool.ssm[:, device_slot], non_blocking=True)

    def fetch(self, host_slot: int, device_slot: int) -> None:
        self.pool.conv[:, device_slot].copy_(self.conv[host_slot], non_blocking=True)
        self.pool.ssm[:, device_slot].copy_(self.ssm[host_slot], non_blocking=True)
